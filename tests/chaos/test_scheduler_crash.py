"""docs/reliability.md S3 on the real broker, Redis, service and agent processes: the scheduler
dies (as a kill -9) at each point of a dispatch: right after claiming the task, after its
admission (locks, budget, epoch) and before publishing it, and after publishing it and before
acknowledging the claim. Restarted, the lease ends, the reaper puts the task back, and it runs
to success once: the agent drains and takes the node offline once, and the task has one final
event. Its own locks and budget place do not hold it back."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import fleet
from schemas.events.v1 import TaskScheduled
from schemas.topics import Topic
from tests.chaos.harness import FLOW, TARGET, all_up, crashed, fault_env, restart, stack_with_fleet
from tests.integration.harness import is_success_of, name, tap, task_events_for
from tests.integration.test_executor_crash import journal_rows
from tests.integration.test_operator_control import UPKEEP_ACTIONS


@pytest.mark.timeout(300)
@pytest.mark.parametrize("point", ["after_claim", "before_dispatch", "after_dispatch"])
async def test_a_scheduler_killed_mid_dispatch_dispatches_the_task_once_after_restart(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path, point: str
) -> None:
    crash = f"scheduler.{point}"
    env = fault_env(kafka_bootstrap, redis_url, namespace, tmp_path, crash)
    env["SCHEDULER_LEASE_S"] = "3"
    async with (stack_with_fleet(redis_url, namespace, tmp_path, env, FLOW) as running,
                tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                    name(Topic.OPS_NODE_STATE, namespace),
                    name(Topic.OPS_TASKS_SCHEDULED, namespace)) as watch):
        await all_up(watch)
        fleet.inject_fault(tmp_path, TARGET, xid=[79])
        index = await crashed(running, "scheduler", crash)
        restart(running, index, tmp_path, env)
        await watch.wait_for(is_success_of(watch, TARGET), 150,
                             "the offline task to succeed after the restart")
        await watch.catch_up()
        events = task_events_for(watch, TARGET)
        final = [e for e in events if e.state in ("succeeded", "failed", "terminated")]
        assert [e.state for e in final] == ["succeeded"], [e.reason for e in events]
        task_id = final[0].task_id
        scheduled = [TaskScheduled.model_validate_json(r.value) for r in watch.records
                     if r.topic.endswith(Topic.OPS_TASKS_SCHEDULED.value)]
        epochs = [s.epoch for s in scheduled if s.task.task_id == task_id]
        if point == "after_dispatch":
            # Published before the crash: the task runs from that dispatch, and one the
            # reaper makes before it ends has a newer epoch, which takes the running
            # workflow over instead of starting it twice.
            assert 1 <= len(epochs) <= 2, epochs
            assert epochs == sorted(set(epochs))
        else:
            assert len(epochs) == 1, epochs
    acted = [(r[1], r[2]) for r in journal_rows(tmp_path, TARGET)
             if r[1] not in UPKEEP_ACTIONS | {"query_status"}]
    assert acted == [("drain_node", "succeeded"), ("offline_node", "succeeded")], acted
