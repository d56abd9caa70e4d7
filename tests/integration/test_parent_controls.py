"""A parent's controls reach its open children, on the real broker, Redis and agent processes.

node-001's offline task moves its two jobs in two child tasks. Every other node is under a
maintenance window, so the children (which touch their destination nodes) wait in the
scheduler's queue while the parent waits for them: the parent's step is open, its children
are open, nothing moves. Then an operator, through TaskControl events:

1. pauses the parent (the pause waits for the step) and resumes it: each child records the
   same pause and resume, naming the parent and its control;
2. the parent's waiting step times out (its children never ran) and the parent fails; a retry
   runs the step again, which plans two new children, and supersedes the first two (a
   terminate naming the parent's retry);
3. the step times out again; a jump past it supersedes the second two children, and a resume
   runs the last step: the parent succeeds.

When the windows end, the four superseded children reach the executor and end terminated
there, without a command sent for them: nothing the operator superseded runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from uuid import UUID

import pytest

from agent import fleet
from common.signing import ensure_signer_keys
from schemas.events.v1 import OpsTask, TaskEvent, now_utc
from schemas.topics import Topic
from services.shared.maintenance import MaintenanceStore, new_window
from services.shared.redis_client import Keys, connect_redis
from services.shared.registry import register
from tests.integration.harness import (
    SMALL_POOL_SAFETY,
    Record,
    Tap,
    edited_templates,
    is_up,
    name,
    producer,
    services,
    stack_env,
    tap,
)
from tests.integration.test_operator_control import Control, control, executed_actions, of_task

NODES = ["node-001", "node-002", "node-003", "node-004"]
SOURCE, DESTINATIONS = NODES[0], NODES[1:]
# The parent's wait for its children: it times out after two of these (one re-run of the
# step, which republishes the same children, then the failure), long enough for a pause and a
# resume to reach the children first on a busy machine.
MIGRATE_TIMEOUT_S = 30
MIGRATE_STEP = 3


def templates_with_short_migration(directory: Path) -> Path:
    """The built-in templates, with the offline task's wait for its job moves cut short."""
    wait = "guard: node_has_jobs\n    timeout_s: 900"
    return edited_templates(directory, "offline.yaml", wait,
                            wait.replace("900", str(MIGRATE_TIMEOUT_S)))


def plans(events: Tap) -> dict[UUID, OpsTask]:
    found: dict[UUID, OpsTask] = {}
    for record in events.records:
        if record.topic.endswith(Topic.OPS_TASK_EVENTS.value):
            event = TaskEvent.model_validate_json(record.value)
            if event.task is not None:
                found[event.task_id] = event.task
    return found


def parent_of(events: Tap) -> OpsTask | None:
    return next((t for t in plans(events).values()
                 if t.need_kind == "offline" and t.target == SOURCE
                 and t.parent_task_id is None), None)


def children(events: Tap, parent: UUID) -> list[UUID]:
    """The parent's children, in the order they were planned."""
    return [t.task_id for t in plans(events).values() if t.parent_task_id == parent]


def via_parent(events: Tap, child: UUID, action: Control) -> TaskEvent | None:
    """The child's transition that applied the parent's `action`."""
    return next((e for e in of_task(events, child)
                 if e.outputs.get("parent_control") == action), None)


def reaches(events: Tap, kids: list[UUID], action: Control) -> Callable[[Record], bool]:
    return lambda _: all(via_parent(events, c, action) is not None for c in kids)


def parent_in(events: Tap, parent: UUID,
              check: Callable[[TaskEvent], bool]) -> Callable[[Record], bool]:
    return lambda _: any(check(e) for e in of_task(events, parent))


def trail(events: Tap, task_id: UUID) -> str:
    return "\n".join(f"{e.state} {e.step_index} {e.step_state} {e.reason} {dict(e.outputs)}"
                     for e in of_task(events, task_id))


def terminated_on_arrival(events: Tap, child: UUID) -> Callable[[Record], bool]:
    """The child reached the executor and ended there on the control kept for it."""
    return lambda _: any(e.state == "terminated" and e.previous_state == "dispatched"
                         for e in of_task(events, child))


def applied(action: Control) -> Callable[[TaskEvent], bool]:
    return lambda e: e.outputs.get("control") == action and not e.outputs.get("refused")


def failed_run(count: int) -> Callable[[list[TaskEvent]], bool]:
    return lambda events: sum(e.state == "failed" and e.step_state is None
                              for e in events) >= count


@pytest.mark.timeout(600)
async def test_pause_resume_retry_and_jump_of_a_parent_reach_its_open_children(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(
        kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
        AGENT_JOBS="sim:train,infer", ANALYZER_ENABLED_NEEDS='["offline"]',
        CAPACITY_PROVIDER="none", COLLECTOR_PROBE_PERIOD_S="3600",
        TEMPLATER_TEMPLATE_DIR=str(templates_with_short_migration(tmp_path / "templates")),
        **SMALL_POOL_SAFETY,
    )
    trusted = ensure_signer_keys(tmp_path / "keys")
    redis = connect_redis(redis_url)
    windows = MaintenanceStore(redis, Keys(namespace))
    async with services(env, tmp_path):
        await register(redis_url, namespace, "itest", NODES)
        fleet.fleet_up(len(NODES), 2, "itest", namespace, tmp_path, env, trusted, 1.0)
        try:
            async with producer(kafka_bootstrap) as prod, tap(
                    kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                    name(Topic.OPS_NODE_STATE, namespace)) as watch:
                for node in NODES:
                    await watch.wait_for(is_up(node), 90, f"{node} up")
                for node in DESTINATIONS:
                    assert await windows.start(new_window(
                        "itest", node, "carol", "rack work", now_utc())) is None

                # ---- the parent waits for two children the windows hold in the queue
                fleet.inject_fault(tmp_path, SOURCE, xid=[79])
                await watch.wait_for(lambda _: parent_of(watch) is not None, 120,
                                     "the offline task of node-001")
                parent = parent_of(watch)
                assert parent is not None
                pid = parent.task_id
                await watch.wait_for(lambda _: len(children(watch, pid)) == 2, 120,
                                     "the two job moves")
                first = children(watch, pid)

                def held(kids: list[UUID]) -> Callable[[Record], bool]:
                    return lambda _: all(any(e.reason.startswith("held: maintenance of node")
                                             for e in of_task(watch, c)) for c in kids)

                await watch.wait_for(held(first), 60, "both moves held by maintenance")

                # ---- 1. pause and resume reach both children
                await control(prod, redis, namespace, pid, "pause", "alice", "look first")
                await watch.wait_for(reaches(watch, first, "pause"), 60,
                                     "the pause at both children")
                await control(prod, redis, namespace, pid, "resume", "alice", "carry on")
                await watch.wait_for(reaches(watch, first, "resume"), 60,
                                     "the resume at both children")
                for child in first:
                    paused = via_parent(watch, child, "pause")
                    assert paused is not None
                    # Kept for the child, which is still queued: applied when it arrives.
                    assert (paused.actor, paused.outputs["control"], paused.outputs["pending"],
                            paused.outputs["parent_task_id"]) == (
                        "alice", "pause", True, str(pid)), trail(watch, child)
                    assert f"via parent {pid} pause: look first" in paused.reason, paused.reason

                # ---- 2. the wait times out; a retry supersedes the children, plans new ones
                await watch.wait_for(
                    parent_in(watch, pid, lambda e: e.state == "failed"
                              and e.step_state is None), 4 * MIGRATE_TIMEOUT_S + 60,
                    "the parent to fail on its children's timeout")
                failure = next(e for e in of_task(watch, pid) if e.state == "failed"
                               and e.step_state is None)
                assert failure.step_index == MIGRATE_STEP, trail(watch, pid)
                await control(prod, redis, namespace, pid, "retry", "alice", "moves once more")
                await watch.wait_for(reaches(watch, first, "retry"), 60,
                                     "the retry superseding both children")
                for child in first:
                    superseded = via_parent(watch, child, "retry")
                    assert superseded is not None
                    assert superseded.outputs["control"] == "terminate", trail(watch, child)
                    assert f"via parent {pid} retry (superseded)" in superseded.reason, (
                        superseded.reason)
                await watch.wait_for(lambda _: len(children(watch, pid)) == 4, 120,
                                     "the retry's two new moves")
                second = [c for c in children(watch, pid) if c not in first]
                await watch.wait_for(held(second), 60, "the new moves held by maintenance")

                # ---- 3. it times out again; a jump past the step supersedes the new ones
                await watch.wait_for(
                    parent_in(watch, pid, lambda _: failed_run(2)(of_task(watch, pid))),
                    4 * MIGRATE_TIMEOUT_S + 60, "the parent to fail a second time")
                await control(prod, redis, namespace, pid, "jump", "alice", "moves later, by hand",
                              step_index=MIGRATE_STEP + 1)
                await watch.wait_for(reaches(watch, second, "jump"), 60,
                                     "the jump superseding the new moves")
                await watch.wait_for(parent_in(watch, pid, applied("jump")), 60,
                                     "the jump at the parent")
                await control(prod, redis, namespace, pid, "resume", "alice", "finish")
                await watch.wait_for(
                    parent_in(watch, pid, lambda e: e.state == "succeeded"
                              and e.step_state is None), 120, "the parent to succeed")
                for child in second:
                    superseded = via_parent(watch, child, "jump")
                    assert superseded is not None, trail(watch, child)
                    assert superseded.outputs["control"] == "terminate", trail(watch, child)

                # ---- the windows end: the superseded children end without running
                for node in DESTINATIONS:
                    assert await windows.end("itest", node) is not None
                for child in first + second:
                    await watch.wait_for(terminated_on_arrival(watch, child), 120,
                                         f"child {child} terminated at the executor")
                for node in DESTINATIONS:
                    moved = [a for a, _ in executed_actions(tmp_path, node)
                             if a in ("start_job", "migrate_job")]
                    assert moved == [], (node, moved)
        finally:
            fleet.fleet_down(tmp_path)
            await redis.aclose()
