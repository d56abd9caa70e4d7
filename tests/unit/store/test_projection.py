"""Pure: a task's and its steps' fields from its transitions, whatever order they came in."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta
from uuid import UUID, uuid4

import pytest

from services.store.projection import Fact, planned_steps, step_views, task_view
from tests.unit.store.scenario import BASE, scale_in_story


def fact(seq: int, seconds: float, state: str, previous: str | None = None, *,
         step: int | None = None, step_state: str | None = None,
         command: UUID | None = None, reason: str = "", **outputs: object) -> Fact:
    return Fact(seq=seq, occurred_at=BASE + timedelta(seconds=seconds), state=state,
                previous_state=previous, step_index=step, step_state=step_state,
                command_id=command, reason=reason, outputs=outputs)


def test_the_latest_transition_gives_the_state_and_reason() -> None:
    facts = [fact(1, 0, "created", reason="made"), fact(3, 2, "running", "dispatched",
                                                         reason="epoch 1"),
             fact(2, 1, "queued", "created", reason="queued")]
    view = task_view(facts)
    assert (view.state, view.reason) == ("running", "epoch 1")
    assert view.created_at == BASE
    assert view.updated_at == BASE + timedelta(seconds=2)
    assert view.finished_at is None


def test_events_of_the_same_instant_keep_their_arrival_order() -> None:
    facts = [fact(2, 5, "paused", "running"), fact(1, 5, "running", "running")]
    assert task_view(facts).state == "paused"


def test_finished_at_is_when_the_final_state_was_reached() -> None:
    facts = [fact(1, 0, "created"), fact(2, 10, "failed", "running", reason="step drain"),
             # A refused control recorded later does not move the end.
             fact(3, 20, "failed", "failed", reason="refused pause: task is final")]
    view = task_view(facts)
    assert view.state == "failed"
    assert view.reason == "refused pause: task is final"
    assert view.finished_at == BASE + timedelta(seconds=10)


def test_a_retried_task_is_unfinished_until_it_ends_again() -> None:
    facts = [fact(1, 0, "created"), fact(2, 10, "failed", "running"),
             fact(3, 20, "running", "failed", reason="retry")]
    assert task_view(facts).finished_at is None
    facts.append(fact(4, 30, "succeeded", "running"))
    assert task_view(facts).finished_at == BASE + timedelta(seconds=30)


def test_created_at_is_the_created_event_even_if_another_came_first() -> None:
    facts = [fact(1, 5, "running", "dispatched"), fact(2, 1, "created")]
    assert task_view(facts).created_at == BASE + timedelta(seconds=1)
    assert task_view([fact(1, 5, "running", "dispatched")]).created_at == \
        BASE + timedelta(seconds=5)


def test_a_task_needs_a_transition() -> None:
    with pytest.raises(ValueError, match="at least one"):
        task_view([])


def test_a_steps_outputs_are_its_latest_attempts() -> None:
    first, second = uuid4(), uuid4()
    facts = [
        fact(1, 1, "running", step=0, step_state="started", command=first),
        fact(2, 2, "running", step=0, step_state="failed", command=first, cause="timeout"),
        fact(3, 3, "running", step=0, step_state="started", command=second),
        fact(4, 4, "running", step=0, step_state="started", command=second,
             reason="waiting", initial_nodes=3, target_nodes=2),
        fact(5, 5, "running", step=0, step_state="completed", command=second,
             reason="done", target_nodes=2, children=1),
        fact(6, 6, "running", step=1, step_state="skipped", skipped=True),
        fact(7, 7, "paused", "running", step=1),  # no step state: not a step event
    ]
    views = step_views(facts)
    assert set(views) == {0, 1}
    step = views[0]
    assert step.state == "completed"
    assert step.reason == "done"
    assert step.attempts == 2
    assert step.command_id == second
    assert step.outputs == {"initial_nodes": 3, "target_nodes": 2, "children": 1}
    assert step.started_at == BASE + timedelta(seconds=3)
    assert step.ended_at == BASE + timedelta(seconds=5)
    skipped = views[1]
    assert (skipped.state, skipped.attempts, skipped.started_at) == ("skipped", 0, None)
    assert skipped.outputs == {"skipped": True}


def test_a_running_step_has_not_ended() -> None:
    command = uuid4()
    views = step_views([fact(1, 1, "running", step=0, step_state="started", command=command)])
    assert views[0].ended_at is None
    assert views[0].attempts == 1


def test_the_views_do_not_depend_on_arrival_order() -> None:
    story = scale_in_story()
    facts = [Fact(seq=i, occurred_at=e.occurred_at, state=e.state,
                  previous_state=e.previous_state, step_index=e.step_index,
                  step_state=e.step_state, command_id=e.command_id, reason=e.reason,
                  outputs=dict(e.outputs))
             for i, e in enumerate(story.events) if e.task_id == story.child.task_id]
    expected = (task_view(facts), step_views(facts))
    rng = random.Random(5)
    for _ in range(20):
        shuffled = facts[:]
        rng.shuffle(shuffled)
        # Arrival order changes too: sequence numbers follow the shuffled order.
        renumbered = [replace(f, seq=i) for i, f in enumerate(shuffled)]
        assert (task_view(renumbered), step_views(renumbered)) == expected


def test_planned_steps_split_the_action_from_its_arguments() -> None:
    story = scale_in_story(node="node-009")
    steps = planned_steps(story.child)
    assert [(s.index, s.name, s.action, s.node_id) for s in steps] == [
        (0, "drain", "drain_node", "node-009"),
        (1, "migrate-jobs", "migrate_jobs", "node-009"),
        (2, "release", "release_node", "node-009"),
    ]
    assert steps[1].action_args == {"pool": "default", "node_id": "node-009", "max_jobs": 64}
    assert steps[1].guard == "node_has_jobs"
    assert planned_steps(story.parent)[0].node_id is None


def test_after_a_restart_the_steps_are_the_latest_runs() -> None:
    first, second, again = uuid4(), uuid4(), uuid4()
    facts = [fact(1, 0, "created"),
             fact(2, 1, "running", step=0, step_state="started", command=first),
             fact(3, 2, "running", step=0, step_state="completed", command=first, mode="d"),
             fact(4, 3, "running", step=1, step_state="started", command=second),
             fact(5, 4, "terminated", "running", reason="terminate: wrong node"),
             # A refused restart changes nothing; the applied one starts the steps over.
             fact(6, 5, "terminated", "terminated", control="restart", refused=True),
             fact(7, 6, "running", "terminated", step=0, control="restart", run=1),
             fact(8, 7, "running", step=0, step_state="started", command=again)]
    views = step_views(facts)
    assert set(views) == {0}
    assert (views[0].state, views[0].command_id, views[0].attempts) == ("started", again, 1)
    assert task_view(facts).finished_at is None
