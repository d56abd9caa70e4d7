"""The API's check of a control against a task's recorded history (pure)."""

from __future__ import annotations

from uuid import uuid4

import pytest

from schemas.events.v1 import TaskEvent
from services.api.control import current_step_state, decide, pause_requested, pending_unseen
from services.executor.control import ControlAction
from tests.unit.api.stories import Ending, history, offline_task

STEPS = 4


def state_of(events: list[TaskEvent]) -> str:
    return events[-1].state


@pytest.mark.parametrize(("ending", "action", "step", "allowed", "why"), [
    ("running", "pause", None, True, "pauses when the running step ends"),
    ("running", "resume", None, False, "not paused"),
    ("running", "retry", None, False, "only a failed task"),
    ("running", "jump", 2, False, "pause first"),
    ("running", "terminate", None, True, "terminated"),
    ("pause_requested", "pause", None, False, "already requested"),
    ("pause_requested", "resume", None, True, "withdrawn"),
    ("paused", "resume", None, True, "resumed"),
    ("paused", "pause", None, False, "already paused"),
    ("paused", "jump", 3, True, "paused at step 3"),
    ("paused", "jump", 4, False, "out of range 0..3"),
    ("failed", "retry", None, True, "runs again"),
    ("failed", "jump", 0, True, "paused at step 0"),
    ("failed", "terminate", None, False, "already failed"),
    ("succeeded", "pause", None, False, "the task is succeeded"),
    ("succeeded", "retry", None, False, "only a failed task"),
    ("queued", "pause", None, True, "applies when the task reaches the executor"),
    ("queued", "retry", None, False, "has not reached the executor"),
    ("queued", "jump", 1, False, "has not reached the executor"),
    ("queued", "resume", None, False, "not paused"),
])
def test_controls_follow_the_executors_rules(ending: Ending, action: ControlAction,
                                             step: int | None, allowed: bool,
                                             why: str) -> None:
    events = history(offline_task(), ending)
    decision = decide(state_of(events), STEPS, events, action, step)
    assert decision.allowed is allowed
    assert why in decision.reason


def _pending(events: list[TaskEvent], control: str) -> TaskEvent:
    last = events[-1]
    return last.model_copy(update={
        "event_id": uuid4(), "actor": "alice", "previous_state": "queued", "state": "queued",
        "reason": f"{control}: held", "outputs": {"control": control, "pending": True}})


def test_a_control_held_for_an_unseen_task_counts() -> None:
    events = history(offline_task(), "queued")
    assert pending_unseen(events) == "queued"
    paused = [*events, _pending(events, "pause")]
    assert pending_unseen(paused) == "paused"
    assert decide("queued", STEPS, paused, "resume", None).allowed
    assert not decide("queued", STEPS, paused, "pause", None).allowed
    resumed = [*paused, _pending(events, "resume")]
    assert pending_unseen(resumed) == "queued"
    terminated = [*events, _pending(events, "terminate")]
    assert not decide("queued", STEPS, terminated, "terminate", None).allowed


def test_a_refused_control_changes_nothing() -> None:
    events = history(offline_task(), "running")
    refused = events[-1].model_copy(update={
        "event_id": uuid4(), "reason": "refused pause: x",
        "outputs": {"control": "pause", "refused": True}})
    assert not pause_requested([*events, refused])


def test_the_current_step_is_the_latest_step_event() -> None:
    assert current_step_state(history(offline_task(), "running")) == (1, "started")
    assert current_step_state(history(offline_task(), "queued")) == (None, None)
    assert current_step_state(history(offline_task(), "failed")) == (1, "failed")


def test_an_unknown_recorded_state_is_refused() -> None:
    assert not decide("exploded", STEPS, [], "pause", None).allowed
