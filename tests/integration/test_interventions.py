"""Interventions on the real broker, Redis and agent processes: an operator's retry, jump and
restart of failed offline tasks each bring the task to success, and a node's maintenance
window holds its task queued (the window named in its transitions) until it ends.

Each node's offline task fails the same way: its agent's fault plan fails `offline_node`
(three attempts, short backoffs), so the task fails at step 1 with the node drained. The
plan is then cleared and the operator intervenes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from uuid import UUID

import pytest

from agent import fleet
from common.signing import ensure_signer_keys
from schemas.events.v1 import TaskEvent, now_utc
from schemas.topics import Topic
from services.shared.maintenance import MaintenanceStore, new_window
from services.shared.redis_client import Keys, connect_redis
from services.shared.registry import register
from tests.integration.harness import (
    Record,
    Tap,
    is_up,
    name,
    producer,
    services,
    stack_env,
    tap,
)
from tests.integration.test_operator_control import (
    UPKEEP_ACTIONS,
    Control,
    control,
    executed_actions,
    has_event,
    of_task,
    task_of,
)

# node-005 stays healthy: with every node unhealthy the short-circuit would hold everything.
NODES = ["node-001", "node-002", "node-003", "node-004", "node-005"]


def final(state: str) -> Callable[[TaskEvent], bool]:
    return lambda e: e.state == state and e.step_state is None


def applied(action: Control) -> Callable[[TaskEvent], bool]:
    return lambda e: e.outputs.get("control") == action and not e.outputs.get("refused")


def has_task(events: Tap, node: str) -> Callable[[Record], bool]:
    return lambda _: task_of(events, node) is not None


@pytest.mark.timeout(600)
async def test_retry_jump_and_restart_succeed_and_maintenance_holds_a_node(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(
        kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
        AGENT_JOBS="", ANALYZER_ENABLED_NEEDS='["offline"]', COLLECTOR_PROBE_PERIOD_S="3600",
        EXECUTOR_BACKOFF_BASE_S="0.2", EXECUTOR_BACKOFF_MAX_S="0.5",
        SCHEDULER_SHORT_CIRCUIT_UNHEALTHY_FRACTION="0.95",
        # Three failed offline tasks would open a cluster-wide breaker for node-004's task.
        SCHEDULER_BREAKER_SCOPE="node",
        SCHEDULER_OFFLINE_BUDGET_FRACTION="1.0",
    )
    trusted = ensure_signer_keys(tmp_path / "keys")
    redis = connect_redis(redis_url)
    windows = MaintenanceStore(redis, Keys(namespace))
    async with services(env, tmp_path):
        await register(redis_url, namespace, "itest", NODES)
        fleet.fleet_up(len(NODES), 1, "itest", namespace, tmp_path, env, trusted, 1.0)
        try:
            async with producer(kafka_bootstrap) as prod, tap(
                    kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                    name(Topic.OPS_NODE_STATE, namespace)) as watch:
                for node in NODES:
                    await watch.wait_for(is_up(node), 90, f"{node} up")

                # ---- maintenance holds node-004's task until it ends -----------------
                window = new_window("itest", "node-004", "carol", "rack work", now_utc())
                assert await windows.start(window) is None
                fleet.inject_fault(tmp_path, "node-004", xid=[79])

                def held(_: object) -> bool:
                    task = task_of(watch, "node-004")
                    return task is not None and any(
                        e.reason.startswith("held: maintenance of node node-004 by carol")
                        for e in of_task(watch, task))
                await watch.wait_for(held, 120, "node-004's task held by maintenance")

                # ---- three failed tasks ----------------------------------------------
                for node in NODES[:3]:
                    fleet.inject_fault(tmp_path, node, fail_actions=["offline_node"])
                    fleet.inject_fault(tmp_path, node, xid=[79])
                failed: dict[str, UUID] = {}
                for node in NODES[:3]:
                    await watch.wait_for(has_task(watch, node), 120, f"{node}'s task")
                    task = task_of(watch, node)
                    assert task is not None
                    await watch.wait_for(has_event(watch, task, final("failed")), 120,
                                         f"{node}'s task to fail")
                    failed[node] = task
                    fleet.inject_fault(tmp_path, node, fail_actions=[])

                # The maintained node's task is still queued: nothing ran on it.
                held_task = task_of(watch, "node-004")
                assert held_task is not None
                assert {e.state for e in of_task(watch, held_task)} == {"created", "queued"}
                assert [a for a, _ in executed_actions(tmp_path, "node-004")
                        if a not in UPKEEP_ACTIONS] == []

                # ---- retry, jump (then resume) and restart ----------------------------
                await control(prod, redis, namespace, failed["node-001"], "retry", "alice",
                              "offline fixed")
                await control(prod, redis, namespace, failed["node-002"], "jump", "alice",
                              "drained already", step_index=1)
                await control(prod, redis, namespace, failed["node-003"], "restart", "alice",
                              "from the top")
                await watch.wait_for(has_event(watch, failed["node-002"], applied("jump")),
                                     60, "the jump applied")
                await control(prod, redis, namespace, failed["node-002"], "resume", "alice", "go")
                for node, task in failed.items():
                    await watch.wait_for(has_event(watch, task, final("succeeded")), 120,
                                         f"{node}'s task to succeed after the operator")

                restart = next(e for e in of_task(watch, failed["node-003"])
                               if applied("restart")(e))
                assert (restart.state, restart.previous_state, restart.step_index,
                        restart.actor) == ("running", "failed", 0, "alice")
                assert restart.outputs["run"] == 1
                after = of_task(watch, failed["node-003"])
                after = after[after.index(restart):]
                assert [(e.step_index, e.step_state) for e in after
                        if e.step_state == "started"][:2] == [(0, "started"), (1, "started")]
                # The agent drained twice (the first run and the restart's).
                done = [a for a, o in executed_actions(tmp_path, "node-003")
                        if o == "succeeded"]
                assert done.count("drain_node") == 2, done
                assert done.count("offline_node") == 1, done
                # The retry ran the failed step again, not the drain before it.
                trail = of_task(watch, failed["node-001"])
                retry = next(e for e in trail if applied("retry")(e))
                assert [e.step_index for e in trail[trail.index(retry):]
                        if e.step_state == "started"][:1] == [1]

                # ---- the window ends: node-004's task runs ---------------------------
                assert await windows.end("itest", "node-004") == window
                await watch.wait_for(has_event(watch, held_task, final("succeeded")), 120,
                                     "node-004's task to run once the window ended")
                trail = of_task(watch, held_task)
                hold = next(e for e in trail if e.reason.startswith("held:"))
                dispatched = next(e for e in trail if e.state == "dispatched")
                assert hold.occurred_at <= dispatched.occurred_at
        finally:
            fleet.fleet_down(tmp_path)
            await redis.aclose()
