"""docs/reliability.md S19 on the real broker, Redis, service and agent processes: each service
of the fault-to-offline flow is stopped with SIGTERM while it has that flow's work in hand.
It stops cleanly (exit 0, within the broker's graceful timeout); started again, the task runs
to success once: the agent drains and takes the node offline once, with one final event."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent import fleet
from schemas.events.v1 import TaskEvent
from schemas.topics import Topic
from tests.chaos.harness import FLOW, TARGET, all_up, fault_env, restart, stack_with_fleet
from tests.integration.harness import (
    Record,
    Tap,
    a_need,
    is_success_of,
    name,
    tap,
    task_events_for,
    until,
)
from tests.integration.test_executor_crash import journal_rows
from tests.integration.test_operator_control import UPKEEP_ACTIONS

GRACEFUL_S = 20.0  # the broker's graceful timeout is 10 s; the rest is the process's own stop


def drain_started(watch: Tap) -> Callable[[Record], bool]:
    def check(_: Record) -> bool:
        return any(e.step_index == 0 and e.step_state == "started"
                   for e in task_events_for(watch, TARGET))
    return check


def a_task(_: Tap) -> Callable[[Record], bool]:
    return lambda record: record.topic.endswith(Topic.OPS_TASKS.value)


def need(_: Tap) -> Callable[[Record], bool]:
    return a_need("offline", TARGET)


def at_once(_: Tap) -> Callable[[Record], bool]:
    return lambda record: True


# When each service has the flow's work in hand: the moment to stop it.
MOMENTS: dict[str, Callable[[Tap], Callable[[Record], bool]]] = {
    "collector": at_once,  # the faulty reports are coming in
    "analyzer": at_once,  # their samples are being judged
    "templater": need,  # the need is out
    "scheduler": a_task,  # the task is out
    "executor": drain_started,  # the drain is on the agent
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("service", list(MOMENTS))
async def test_a_service_stopped_mid_flow_stops_cleanly_and_the_task_runs_once(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path, service: str
) -> None:
    env = fault_env(kafka_bootstrap, redis_url, namespace, tmp_path, "")
    async with (stack_with_fleet(redis_url, namespace, tmp_path, env, FLOW) as running,
                tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                    name(Topic.OPS_NODE_STATE, namespace), name(Topic.OPS_NEEDS, namespace),
                    name(Topic.OPS_TASKS, namespace)) as watch):
        await all_up(watch)
        mark = len(watch.records)
        fleet.inject_fault(tmp_path, TARGET, xid=[79])
        await watch.wait_for(MOMENTS[service](watch), 90, f"work in the {service}'s hands",
                             start=mark)
        index = next(i for i, s in enumerate(running) if s.name == service)
        stopping = running[index]
        stopping.process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        await until(lambda: stopping.process.poll() is not None, GRACEFUL_S + 10,
                    f"the {service} to stop")
        assert time.monotonic() - sent < GRACEFUL_S
        assert stopping.process.returncode == 0, stopping.log_path.read_text(errors="replace")
        restart(running, index, tmp_path, env)
        await watch.wait_for(is_success_of(watch, TARGET), 150,
                             "the offline task to succeed after the restart")
        await watch.catch_up()
        events: list[TaskEvent] = task_events_for(watch, TARGET)
        final = [e for e in events if e.state in ("succeeded", "failed", "terminated")]
        assert [e.state for e in final] == ["succeeded"], [e.reason for e in events]
    acted = [(r[1], r[2]) for r in journal_rows(tmp_path, TARGET)
             if r[1] not in UPKEEP_ACTIONS | {"query_status"}]
    assert acted == [("drain_node", "succeeded"), ("offline_node", "succeeded")], acted

