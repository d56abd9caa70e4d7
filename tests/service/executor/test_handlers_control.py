"""Operator controls on the executor (real redis-server at REDIS_URL, recorded bus): pause at
the step boundary, resume, retry, terminate, jump, parents and children, and controls that
arrive before their task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from uuid import UUID, uuid4

import pytest
from redis.asyncio import Redis

from common.errors import PermanentError
from schemas.events.v1 import (
    DrainNode,
    MigrateJobs,
    OpsTask,
    TaskControl,
    TaskEvent,
    now_utc,
)
from services.executor.commands import command_id_for
from services.executor.ports import Waiting
from services.shared.redis_client import Keys
from services.shared.vouchers import ControlVouchers
from tests.service.executor.test_handlers import (
    CLUSTER,
    NODE,
    Harness,
    drain_offline,
    make_harness,
    make_task,
    migrate_child,
)

OPERATOR = "alice"
Action = Literal["pause", "resume", "retry", "terminate", "jump", "restart"]




@pytest.fixture
def harness(redis: Redis, keys: Keys, tmp_path: Path) -> Harness:
    return make_harness(redis, keys, tmp_path)


def control(task: OpsTask | UUID, action: Action, step: int | None = None,
            reason: str = "operator says so") -> TaskControl:
    task_id = task if isinstance(task, UUID) else task.task_id
    return TaskControl(event_id=uuid4(), source="api", occurred_at=now_utc(),
                       cluster_id=CLUSTER, subject=str(task_id), task_id=task_id,
                       action=action, step_index=step, actor=OPERATOR, reason=reason)


async def send(harness: Harness, task: OpsTask | UUID, action: Action,
               step: int | None = None) -> TaskEvent:
    """Apply a control; the first event about the task it caused (the transition)."""
    ctl = control(task, action, step)
    before = len(harness.events())
    await harness.control(ctl)
    return next(e for e in harness.events()[before:] if e.task_id == ctl.task_id)


# ---------------------------------------------------------------- pause and resume


async def test_pause_waits_for_the_running_step_then_resume_goes_on(harness: Harness) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    drain = harness.last_command()
    requested = await send(harness, task, "pause")
    assert (requested.state, requested.actor) == ("running", OPERATOR)
    assert "the running step ends" in requested.reason
    await harness.answer(drain)  # the running command finishes...
    paused = harness.events(task)[-1]
    assert (paused.state, paused.previous_state, paused.actor, paused.step_index) == (
        "paused", "running", OPERATOR, 1)
    assert harness.last_command() == drain  # ...and the next step does not start
    await harness.executor.sweep_deadlines()
    assert harness.last_command() == drain
    resumed = await send(harness, task, "resume")
    assert (resumed.state, resumed.previous_state, resumed.actor) == ("running", "paused",
                                                                      OPERATOR)
    assert harness.last_command().action.action == "offline_node"
    assert await harness.lock_owner(f"node.{NODE}") == str(task.task_id)


async def test_a_pause_between_attempts_takes_effect_at_once(harness: Harness) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    await harness.answer(harness.last_command(), "failed", "injected_failure")
    paused = await send(harness, task, "pause")
    assert (paused.state, paused.previous_state) == ("paused", "running")
    await harness.retry_now(task)
    assert len(harness.commands()) == 1  # the retry waits for the resume
    await send(harness, task, "resume")
    assert harness.last_command().command_id == command_id_for(task.task_id, 0, 1)


async def test_a_resume_withdraws_a_pause_not_taken_yet(harness: Harness) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    await send(harness, task, "pause")
    withdrawn = await send(harness, task, "resume")
    assert withdrawn.state == "running"
    assert "withdrawn" in withdrawn.reason
    await harness.answer(harness.last_command())
    assert harness.last_command().action.action == "offline_node"


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("action", "step", "why"),
    [("retry", None, "refused retry: only a failed task can be retried; it is running"),
     ("resume", None, "refused resume: the task is running, not paused"),
     ("jump", 0, "refused jump: the task is running: pause first")],
)
async def test_an_illegal_control_is_refused_with_the_reason(
    harness: Harness, action: Action, step: int | None, why: str,
) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    refused = await send(harness, task, action, step)
    assert (refused.state, refused.previous_state, refused.actor, refused.reason) == (
        "running", "running", OPERATOR, why)
    assert refused.outputs["refused"] is True
    assert (await harness.wf(task)).state == "running"


async def test_a_redelivered_control_acts_once(harness: Harness) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    await harness.answer(harness.last_command(), "failed", "injected_failure")
    pause, resume = control(task, "pause"), control(task, "resume")
    for ctl in (pause, resume, pause):  # the pause is delivered again after the resume
        await harness.control(ctl)
    assert (await harness.wf(task)).state == "running"


async def test_a_control_the_api_did_not_vouch_for_is_refused_and_changes_nothing(
        harness: Harness) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    # Published by someone who reached the broker, past the API's roles and audit.
    with pytest.raises(PermanentError, match="was not sent through the API"):
        await harness.executor.on_control(control(task, "terminate"))
    # One the API vouched for, changed on the way.
    vouched = control(task, "terminate")
    await ControlVouchers(harness.redis, harness.keys).vouch(vouched)
    with pytest.raises(PermanentError, match="differs from the one the API sent"):
        await harness.executor.on_control(vouched.model_copy(update={"action": "pause"}))
    assert (await harness.wf(task)).state == "running"


async def test_jump_out_of_range_is_refused(harness: Harness) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    await send(harness, task, "pause")
    await harness.answer(harness.last_command())
    refused = await send(harness, task, "jump", 5)
    assert refused.reason == "refused jump: step 5 is out of range 0..1"


# ---------------------------------------------------------------- retry and jump


async def test_a_failed_task_is_retried_from_its_failed_step_with_its_locks(
    harness: Harness,
) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    await harness.answer(harness.last_command())
    await harness.answer(harness.last_command(), "failed", "not_drained")
    assert harness.final(task).state == "failed"
    assert await harness.lock_owner(f"node.{NODE}") is None
    retried = await send(harness, task, "retry")
    assert (retried.state, retried.previous_state, retried.actor) == ("running", "failed",
                                                                      OPERATOR)
    again = harness.last_command()
    # Step 1 again, from attempt 0, under a new command id (not the agent's cached answer).
    assert again.action.action == "offline_node"
    assert again.command_id == command_id_for(task.task_id, 1, 0, run=1)
    assert again.command_id != command_id_for(task.task_id, 1, 0)
    assert await harness.lock_owner(f"node.{NODE}") == str(task.task_id)
    await harness.answer(again)
    assert harness.final(task).state == "succeeded"
    assert await harness.redis.ttl(harness.keys.workflow(str(task.task_id))) > 0


async def test_a_retry_is_refused_while_another_task_holds_a_lock(harness: Harness) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    await harness.answer(harness.last_command(), "rejected", "expired")
    other = str(uuid4())
    await harness.redis.set(harness.keys.lock(f"node.{NODE}"), other)
    refused = await send(harness, task, "retry")
    assert refused.reason == f"refused retry: lock node.{NODE} is held by task {other}"
    assert (await harness.wf(task)).state == "failed"


async def test_jump_moves_a_paused_task_to_a_step_and_resume_runs_it(harness: Harness) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    await send(harness, task, "pause")
    await harness.answer(harness.last_command())
    jumped = await send(harness, task, "jump", 0)
    assert (jumped.state, jumped.step_index, jumped.actor) == ("paused", 0, OPERATOR)
    await send(harness, task, "resume")
    again = harness.last_command()
    assert again.action.action == "drain_node"
    assert again.command_id == command_id_for(task.task_id, 0, 0, run=1)


async def test_jump_from_a_failure_waits_paused_holding_the_locks(harness: Harness) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    await harness.answer(harness.last_command(), "failed", "not_drained")
    jumped = await send(harness, task, "jump", 1)
    assert (jumped.state, jumped.previous_state) == ("paused", "failed")
    assert await harness.lock_owner(f"node.{NODE}") == str(task.task_id)
    await send(harness, task, "resume")
    assert harness.last_command().action.action == "offline_node"


# ---------------------------------------------------------------- restart


async def test_a_failed_task_restarts_from_its_first_step_under_a_new_epoch(
    harness: Harness,
) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    before = await harness.wf(task)
    await harness.answer(harness.last_command())
    await harness.answer(harness.last_command(), "failed", "not_drained")
    assert harness.final(task).state == "failed"
    restarted = await send(harness, task, "restart")
    assert (restarted.state, restarted.previous_state, restarted.actor,
            restarted.step_index) == ("running", "failed", OPERATOR, 0)
    wf = await harness.wf(task)
    assert wf.epoch > before.epoch
    assert (wf.run, wf.step, wf.outputs) == (1, 0, {})
    assert restarted.outputs == {"control": "restart", "run": 1, "epoch": wf.epoch}
    again = harness.last_command()
    assert again.action.action == "drain_node"
    assert again.command_id == command_id_for(task.task_id, 0, 0, run=1)
    assert again.epoch == wf.epoch
    assert await harness.lock_owner(f"node.{NODE}") == str(task.task_id)
    await harness.answer(again)
    await harness.answer(harness.last_command())
    assert harness.final(task).state == "succeeded"


async def test_a_terminated_task_restarts_and_a_running_one_is_refused(
    harness: Harness,
) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    refused = await send(harness, task, "restart")
    assert refused.reason == ("refused restart: only a failed or terminated task can be "
                              "restarted; it is running")
    await send(harness, task, "terminate")
    assert await harness.lock_owner(f"node.{NODE}") is None
    restarted = await send(harness, task, "restart")
    assert (restarted.state, restarted.previous_state) == ("running", "terminated")
    assert harness.last_command().action.action == "drain_node"
    assert await harness.lock_owner(f"node.{NODE}") == str(task.task_id)
    assert await harness.redis.ttl(harness.keys.workflow(str(task.task_id))) == -1


# ---------------------------------------------------------------- terminate


async def test_terminate_cancels_the_running_command_and_releases_the_locks(
    harness: Harness,
) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    drain = harness.last_command()
    terminated = await send(harness, task, "terminate")
    assert (terminated.state, terminated.previous_state, terminated.actor) == (
        "terminated", "running", OPERATOR)
    assert terminated.outputs == {"need_kind": "offline", "kind": "offline",
                                  "cause": "terminated"}
    cancel = harness.last_command()
    assert cancel.action.action == "cancel"
    assert cancel.action.command_id == drain.command_id
    assert cancel.seq > drain.seq
    assert await harness.lock_owner(f"node.{NODE}") is None
    await harness.answer(drain)  # the command's answer comes in anyway: nothing moves
    assert len(harness.commands()) == 2
    refused = await send(harness, task, "terminate")
    assert refused.reason == "refused terminate: the task is already terminated"


async def test_controls_on_a_parent_apply_to_its_open_children(harness: Harness) -> None:
    parent = make_task(MigrateJobs(pool="default", node_id=NODE))
    kids = [migrate_child(parent, "j1"), migrate_child(parent, "j2")]
    harness.centre.results = {0: [Waiting(kids)]}
    await harness.dispatch(parent)
    await harness.dispatch(kids[0])  # running; kids[1] is still queued at the scheduler
    await send(harness, parent, "pause")
    kid0 = harness.events(kids[0])[-1]
    assert (kid0.state, kid0.actor) == ("running", OPERATOR)
    assert "via parent" in kid0.reason
    assert "running step ends" in kid0.reason
    await send(harness, parent, "terminate")
    cancel = harness.last_command()
    assert cancel.action.action == "cancel"
    assert harness.final(kids[0]).state == "terminated"
    assert harness.final(parent).state == "terminated"
    # The queued child is terminated as soon as it reaches the executor.
    await harness.dispatch(kids[1])
    final = harness.final(kids[1])
    assert (final.state, final.actor, final.outputs["cause"]) == ("terminated", OPERATOR,
                                                                  "terminated")
    assert await harness.lock_owner("job.j2") is None


async def test_a_retry_or_restart_of_a_parent_terminates_the_children_it_had(
    harness: Harness,
) -> None:
    parent = make_task(MigrateJobs(pool="default", node_id=NODE))
    kids = [migrate_child(parent, "j1"), migrate_child(parent, "j2")]
    new_kids = [migrate_child(parent, "j3")]
    harness.centre.results = {0: [Waiting(kids), Waiting(new_kids)]}
    await harness.dispatch(parent)
    await harness.dispatch(kids[0])
    await harness.dispatch(kids[1])
    await harness.answer(harness.last_command())  # kids[1] ends; kids[0] is still open
    # The parent's wait fails (say its deadline recovery gave up): kids[0] is still open.
    wf = await harness.wf(parent)
    await harness.executor.workflow.step_failed(wf, "failed", "centre_error", permanent=True)
    assert harness.final(parent).state == "failed"
    await send(harness, parent, "retry")
    kid0 = harness.final(kids[0])
    assert (kid0.state, kid0.actor, kid0.outputs["parent_control"],
            kid0.outputs["parent_task_id"]) == ("terminated", OPERATOR, "retry",
                                                str(parent.task_id))
    assert kid0.reason.startswith(f"terminate: via parent {parent.task_id} retry "
                                  "(superseded)")
    assert harness.final(kids[1]).state == "succeeded"  # finished: left alone
    # The step's re-run made new children, which the parent now waits for.
    assert (await harness.wf(parent)).waiting == 1


async def test_a_paused_parent_waiting_for_children_does_not_time_out(
    harness: Harness,
) -> None:
    parent = make_task(MigrateJobs(pool="default", node_id=NODE))
    kid = migrate_child(parent, "j1")
    harness.centre.results = {0: [Waiting([kid])]}
    await harness.dispatch(parent)
    await send(harness, parent, "pause")
    for _ in range(3):
        await harness.expire_deadline(parent)
        await harness.executor.sweep_deadlines()
    wf = await harness.wf(parent)
    assert (wf.state, wf.step_state) == ("running", "started")
    assert wf.deadline_ms == harness.clock.ms() + 30_000
    # The child (paused when it arrives) resumes with its parent and ends the wait.
    await harness.dispatch(kid)
    assert harness.events(kid)[-1].state == "paused"
    await send(harness, parent, "resume")
    await harness.answer(harness.last_command())
    assert harness.final(kid).state == "succeeded"
    assert harness.final(parent).state == "succeeded"


# ---------------------------------------------------------------- before the task arrives


async def test_a_task_paused_before_it_arrives_waits_for_a_resume(harness: Harness) -> None:
    task = drain_offline()
    pending = await send(harness, task, "pause")
    assert (pending.state, pending.outputs.get("pending")) == ("queued", True)
    await harness.dispatch(task)
    paused = harness.events(task)[-1]
    assert (paused.state, paused.actor, paused.previous_state) == ("paused", OPERATOR,
                                                                   "dispatched")
    assert harness.commands() == []
    await send(harness, task, "resume")
    assert harness.last_command().action.action == "drain_node"


async def test_a_pending_pause_can_be_withdrawn(harness: Harness) -> None:
    task = drain_offline()
    await send(harness, task, "pause")
    await send(harness, task, "resume")
    await harness.dispatch(task)
    assert harness.last_command().action.action == "drain_node"


async def test_a_control_that_needs_a_started_task_is_refused_before_it_arrives(
    harness: Harness,
) -> None:
    task_id = uuid4()
    refused = await send(harness, task_id, "retry")
    assert refused.reason == "refused retry: the task has not reached the executor"
    refused = await send(harness, task_id, "resume")
    assert refused.reason == "refused resume: the task is queued, not paused"


async def test_a_task_terminated_before_it_arrives_never_runs(harness: Harness) -> None:
    task = make_task(DrainNode(node_id=NODE))
    await send(harness, task, "terminate")
    await harness.dispatch(task)
    assert harness.commands() == []
    final = harness.final(task)
    assert (final.state, final.actor) == ("terminated", OPERATOR)
    assert await harness.lock_owner(f"node.{NODE}") is None
