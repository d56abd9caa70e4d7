"""Operator control (docs/reliability.md S18) on the real broker, Redis and agent processes.

Each offline task's drain is held up deterministically: the agent's fault plan ignores
commands, so the drain step stays started until the agent listens again and the executor's
deadline recovery (status query, then the same command again) gets it done. Meanwhile an
operator, through TaskControl events: has illegal controls refused, pauses a task (it stops
at the next step boundary) and resumes it to success; and terminates another task in the
middle of its drain (locks released, a cancel sent to the agent, nothing done on the node).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal
from uuid import UUID, uuid4

import pytest
from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from agent import fleet
from agent.journal import JOURNAL_FILE
from common.signing import ensure_signer_keys, unb64url
from schemas.events.v1 import (
    Command,
    CommandPayload,
    TaskControl,
    TaskEvent,
    now_utc,
)
from schemas.topics import Topic
from services.shared.redis_client import Keys, connect_redis
from services.shared.registry import register
from services.shared.vouchers import ControlVouchers
from tests.integration.harness import (
    Record,
    Tap,
    is_up,
    name,
    producer,
    services,
    short_drain_templates,
    stack_env,
    tap,
)

NODES = ["node-001", "node-002", "node-003"]
# The drain's deadline: when the executor asks the agent again. What the test does while a
# drain is held up (four controls answered before node-002 listens again; the terminate of
# node-003's task) must be done before it. That took about 0.1 s on the shared 2-core machine;
# the deadline leaves far more than any load makes of it, and the test checks it was not
# reached first (a clear failure, not a puzzle), as test_console does.
DRAIN_TIMEOUT_S = 60
ASKED = "asked the agent for the status"
Control = Literal["pause", "resume", "retry", "terminate", "jump", "restart"]


def task_events(events: Tap) -> list[TaskEvent]:
    return [TaskEvent.model_validate_json(r.value) for r in events.records
            if r.topic.endswith(Topic.OPS_TASK_EVENTS.value)]


def task_of(events: Tap, target: str) -> UUID | None:
    """The (first) task aimed at `target`."""
    return next((e.task_id for e in task_events(events)
                 if e.task is not None and e.task.target == target), None)


def of_task(events: Tap, task_id: UUID) -> list[TaskEvent]:
    return [e for e in task_events(events) if e.task_id == task_id]


def has_event(events: Tap, task_id: UUID,
              check: Callable[[TaskEvent], bool]) -> Callable[[Record], bool]:
    return lambda _: any(check(e) for e in of_task(events, task_id))


def drain_started(events: Tap, target: str) -> Callable[[Record], bool]:
    def check(_: Record) -> bool:
        task_id = task_of(events, target)
        return task_id is not None and any(
            e.step_index == 0 and e.step_state == "started" for e in of_task(events, task_id))
    return check


def first_start(events: Tap, task_id: UUID) -> TaskEvent:
    return next(e for e in of_task(events, task_id)
                if e.step_index == 0 and e.step_state == "started")


def commands_sent(events: Tap) -> list[CommandPayload]:
    return [CommandPayload.model_validate_json(
                unb64url(Command.model_validate_json(r.value).payload))
            for r in events.records if r.topic.endswith(Topic.NODE_COMMANDS.value)]


async def control(prod: AIOKafkaProducer, redis: Redis, namespace: str, task_id: UUID,
                  action: Control, actor: str, reason: str,
                  step_index: int | None = None) -> None:
    """What the API does after it checked the operator's role and audited the control:
    vouch for it, then publish it."""
    event = TaskControl(event_id=uuid4(), source="itest-console", occurred_at=now_utc(),
                        cluster_id="itest", subject=str(task_id), task_id=task_id,
                        action=action, step_index=step_index, actor=actor, reason=reason)
    await ControlVouchers(redis, Keys(namespace)).vouch(event)
    await prod.send_and_wait(name(Topic.OPS_TASK_CONTROL, namespace),
                             event.model_dump_json().encode(), key=str(task_id).encode())


async def watch_for(events: Tap, seconds: float) -> None:
    """Keep reading for `seconds`, so what follows sees everything published meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for recs in (await events.consumer.getmany(timeout_ms=250)).values():
            events.records.extend(recs)


def overrun(events: Tap, task_id: UUID, work: str) -> None:
    """Fail, saying so, if the drain's deadline came before `work` was done: the executor
    has asked the (deaf) node about the drain already."""
    asked = [e.reason for e in of_task(events, task_id) if ASKED in e.reason]
    spent = (now_utc() - first_start(events, task_id).occurred_at).total_seconds()
    print(f"\n{work}: {spent:.1f} s of the drain's {DRAIN_TIMEOUT_S} s")
    assert not asked, f"{work} outlasted the drain's deadline ({DRAIN_TIMEOUT_S} s): {asked}"


def refused(action: Control) -> Callable[[TaskEvent], bool]:
    return lambda e: (e.outputs.get("control") == action and e.outputs.get("refused") is True
                      and e.reason.startswith(f"refused {action}"))


# Commands the centre sends every node whatever its tasks: probes of the command path, its
# peer list, its report interval. A test of a task's effect on a node leaves them out.
UPKEEP_ACTIONS = frozenset({"probe_node", "set_peers", "set_report_interval"})


def executed_actions(state_dir: Path, node: str) -> list[tuple[str, str]]:
    """(action, outcome) of every command in a node's journal."""
    path = fleet.agent_dir(state_dir, node) / JOURNAL_FILE
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [(str(a), str(o)) for a, o in db.execute(
            "SELECT action, outcome FROM commands ORDER BY recorded_at")]
    finally:
        db.close()


@pytest.mark.timeout(600)  # two drain deadlines; the waits' own deadlines are what should fail
async def test_an_operator_pauses_resumes_and_terminates_running_tasks(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(
        kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
        AGENT_JOBS="", ANALYZER_ENABLED_NEEDS='["offline"]',
        TEMPLATER_TEMPLATE_DIR=str(short_drain_templates(tmp_path / "templates", DRAIN_TIMEOUT_S)),
        # Agents that ignore commands must not also fail the centre's probes meanwhile.
        COLLECTOR_PROBE_PERIOD_S="3600",
        # Two of three nodes go offline here: let the pool's safety limits allow it.
        SCHEDULER_SHORT_CIRCUIT_UNHEALTHY_FRACTION="0.9",
        SCHEDULER_OFFLINE_BUDGET_FRACTION="1.0",
    )
    trusted = ensure_signer_keys(tmp_path / "keys")
    keys = Keys(namespace)
    redis = connect_redis(redis_url)

    async def timers(task_id: str) -> list[str]:
        """The executor's timers of a task: a step deadline, a retry (journal.py)."""
        return [key for key in (keys.workflow_deadlines(), keys.workflow_retries())
                if await redis.zscore(key, task_id) is not None]

    async with services(env, tmp_path):
        await register(redis_url, namespace, "itest", NODES)
        fleet.fleet_up(len(NODES), 1, "itest", namespace, tmp_path, env, trusted, 1.0)
        try:
            async with producer(kafka_bootstrap) as prod, tap(
                    kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                    name(Topic.OPS_NODE_STATE, namespace),
                    name(Topic.NODE_COMMANDS, namespace)) as watch:
                for node in NODES:
                    await watch.wait_for(is_up(node), 90, f"{node} up")
                for node in ("node-002", "node-003"):
                    fleet.inject_fault(tmp_path, node, ignore_commands=True)

                # ---- pause and resume ------------------------------------------------
                fleet.inject_fault(tmp_path, "node-002", xid=[79])
                await watch.wait_for(drain_started(watch, "node-002"), 120,
                                     "node-002's drain to start")
                paused_task = task_of(watch, "node-002")
                assert paused_task is not None

                # Illegal while the task runs: resume (nothing is paused) and jump.
                await control(prod, redis, namespace, paused_task, "resume", "alice", "try resume")
                await watch.wait_for(has_event(watch, paused_task, refused("resume")), 30,
                                     "the resume of a running task refused")
                await control(prod, redis, namespace, paused_task, "jump", "alice", "skip ahead",
                              step_index=1)
                await watch.wait_for(has_event(watch, paused_task, refused("jump")), 30,
                                     "the jump of a running task refused")

                await control(prod, redis, namespace, paused_task, "pause", "alice",
                              "hold for maintenance")
                await watch.wait_for(has_event(
                    watch, paused_task, lambda e: e.outputs.get("control") == "pause"
                    and e.actor == "alice" and not e.outputs.get("refused")), 30,
                    "the pause acknowledged")
                # The step runs on: only its end pauses the task. A second pause, handled
                # after the first, is refused as waiting (not as paused); by then everything
                # the first led to is on the topics.
                await control(prod, redis, namespace, paused_task, "pause", "alice", "again")
                await watch.wait_for(has_event(
                    watch, paused_task, lambda e: refused("pause")(e)
                    and "a pause is already requested" in e.reason), 30,
                    "the second pause refused as one already requested")
                await watch.catch_up()
                assert not any(e.state == "paused" for e in of_task(watch, paused_task))
                # All that happened before the drain's deadline: the executor has not asked
                # the node about its drain yet (were it to ask now, the node would not answer
                # and the drain would fail instead of completing).
                overrun(watch, paused_task, "the controls of the paused task")
                fleet.inject_fault(tmp_path, "node-002", ignore_commands=False)

                await watch.wait_for(
                    has_event(watch, paused_task, lambda e: e.state == "paused"),
                    DRAIN_TIMEOUT_S + 120, "the task paused at the next step boundary")
                trail = of_task(watch, paused_task)
                stop = next(e for e in trail if e.state == "paused")
                assert (stop.actor, stop.reason, stop.step_index, stop.previous_state) == (
                    "alice", "pause: hold for maintenance", 1, "running")
                # The drain completed first: the executor's deadline asked the agent, found
                # the command never arrived, and sent it again.
                assert any("sent again with the same command id" in e.reason for e in trail)
                drained = next(e for e in trail
                               if e.step_index == 0 and e.step_state == "completed")
                assert drained.outputs.get("mode") == "draining"
                workflow = await redis.hgetall(keys.workflow(str(paused_task)))
                assert (workflow[b"state"], workflow[b"step"]) == (b"paused", b"1")

                # Paused means paused: the next step does not start. The executor has handled
                # a later control of the task (a retry, refused: it is paused, not failed),
                # and the task has no timer left that could start a step (the deadline sweep
                # only acts on those).
                await control(prod, redis, namespace, paused_task, "retry", "alice", "again")
                await watch.wait_for(has_event(
                    watch, paused_task, lambda e: refused("retry")(e)
                    and "it is paused" in e.reason), 30, "the retry of a paused task refused")
                await watch.catch_up()
                assert not any(e.step_index == 1 and e.step_state == "started"
                               for e in of_task(watch, paused_task))
                assert not await timers(str(paused_task))

                await control(prod, redis, namespace, paused_task, "resume", "alice", "window over")
                await watch.wait_for(
                    has_event(watch, paused_task, lambda e: e.state == "succeeded"), 60,
                    "the resumed task to succeed")
                trail = of_task(watch, paused_task)
                resumed = next(e for e in trail if e.outputs.get("control") == "resume"
                               and not e.outputs.get("refused"))
                assert (resumed.state, resumed.previous_state, resumed.actor) == (
                    "running", "paused", "alice")
                assert resumed.reason.startswith("resume: window over")
                after = trail[trail.index(resumed):]
                assert [(e.step_index, e.step_state) for e in after
                        if e.step_state in ("started", "completed")][:2] == [
                    (1, "started"), (1, "completed")]
                # The agent drained once (on the command sent again) and took it offline.
                done = [a for a, _ in executed_actions(tmp_path, "node-002")]
                assert done.count("drain_node") == 1, done
                assert done.count("offline_node") == 1, done
                assert done.index("query_status") < done.index("drain_node") < done.index(
                    "offline_node"), done

                # ---- terminate ------------------------------------------------------
                fleet.inject_fault(tmp_path, "node-003", xid=[79])
                await watch.wait_for(drain_started(watch, "node-003"), 120,
                                     "node-003's drain to start")
                doomed = task_of(watch, "node-003")
                assert doomed is not None
                created = next(e.task for e in of_task(watch, doomed) if e.task is not None)
                assert created is not None
                locks = [keys.lock(k) for k in created.mutex_keys]
                assert locks
                assert await redis.exists(*locks) == len(locks)
                drain_id = first_start(watch, doomed).command_id

                await control(prod, redis, namespace, doomed, "terminate", "bob", "wrong node")
                await watch.wait_for(
                    has_event(watch, doomed, lambda e: e.state == "terminated"), 30,
                    "the task terminated")
                overrun(watch, doomed, "the terminate")
                final = next(e for e in of_task(watch, doomed) if e.state == "terminated")
                assert (final.actor, final.previous_state) == ("bob", "running")
                assert final.reason.startswith("terminate: wrong node")
                assert final.outputs.get("cause") == "terminated"
                assert await redis.exists(*locks) == 0

                # A cancel of the running drain went to the agent.
                await watch.wait_for(lambda _: any(
                    c.action.action == "cancel" and getattr(c.action, "command_id", None)
                    == drain_id for c in commands_sent(watch)), 30, "the cancel command")
                cancel = next(c for c in commands_sent(watch) if c.action.action == "cancel")
                assert (cancel.node_id, cancel.task_id) == ("node-003", doomed)
                # Past the drain's deadline nothing more is sent for the terminated task
                # (no status query, no drain sent again): its timers went with it, so the
                # deadline sweep (which acts on timers only) has nothing to act on.
                assert not await timers(str(doomed))
                started_at = first_start(watch, doomed).occurred_at
                await watch_for(watch, max(0.0, DRAIN_TIMEOUT_S + 3.0 - (
                    now_utc() - started_at).total_seconds()))
                await watch.catch_up()
                # The task's own commands (on a loaded machine a late report makes the node
                # suspect for a moment, and the centre probes it: not the task's doing).
                for_task = [c.action.action for c in commands_sent(watch)
                            if c.node_id == "node-003" and c.task_id == doomed]
                assert for_task == ["drain_node", "cancel"], for_task
                assert of_task(watch, doomed)[-1].state == "terminated"
                # The agent ignored both (its fault plan): nothing was done on the node.
                assert executed_actions(tmp_path, "node-003") == []
        finally:
            fleet.fleet_down(tmp_path)
            await redis.aclose()
