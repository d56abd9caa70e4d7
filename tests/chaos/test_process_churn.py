"""docs/reliability.md S1 and S12 on the real broker, Redis, service and agent processes: the
collector killed (kill -9) while the faulty node's reports come in, and a rebalance storm (a
second analyzer and executor started, the first killed, three times over) while an offline
task runs. Nothing is lost: the collector's consumer group catches up with every report, and
nothing is done twice: one need, one task, one final event, and the agent drains and takes the
node offline once."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from agent import fleet
from schemas.topics import Topic
from tests.chaos.harness import FLOW, TARGET, all_up, fault_env, stack_with_fleet
from tests.chaos.test_graceful_stop import drain_started
from tests.chaos.test_redis_partition import acted_on
from tests.integration.harness import (
    Tap,
    a_need,
    is_success_of,
    name,
    processed,
    tap,
    task_events_for,
    until,
)
from tests.integration.test_detection import needs_in
from warden import launcher


def kill(running: list[launcher.ServiceProcess], victim: launcher.ServiceProcess) -> None:
    """kill -9 one instance; it leaves `running`, which must hold only live services."""
    os.kill(victim.process.pid, signal.SIGKILL)
    victim.process.wait(10)
    running.remove(victim)


def add(running: list[launcher.ServiceProcess], state_dir: Path, env: dict[str, str],
        service: str) -> launcher.ServiceProcess:
    """One more instance of `service` (same consumer groups: a rebalance)."""
    started = launcher.start_services(state_dir, env, (service,))[0]
    running.append(started)
    return started


def once(watch: Tap, state_dir: Path) -> None:
    """One need, one successful task with one final event, one drain and one offline."""
    assert [(n.kind, n.target) for n in needs_in(watch)] == [("offline", TARGET)]
    events = task_events_for(watch, TARGET)
    final = [e for e in events if e.state in ("succeeded", "failed", "terminated")]
    assert [e.state for e in final] == ["succeeded"], [e.reason for e in events]
    assert acted_on(state_dir, TARGET) == [("drain_node", "succeeded"),
                                           ("offline_node", "succeeded")]


@pytest.mark.timeout(300)
async def test_a_collector_killed_mid_batch_loses_no_report_and_raises_the_need_once(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = fault_env(kafka_bootstrap, redis_url, namespace, tmp_path, "")
    async with (stack_with_fleet(redis_url, namespace, tmp_path, env, FLOW) as running,
                tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                    name(Topic.OPS_NODE_STATE, namespace), name(Topic.OPS_NEEDS, namespace),
                    name(Topic.NODE_REPORTS, namespace)) as watch):
        await all_up(watch)
        fleet.inject_fault(tmp_path, TARGET, xid=[79])
        await watch.wait_for(lambda r: r.topic.endswith(Topic.NODE_REPORTS.value)
                             and r.key == TARGET.encode() and b'"kind":"xid"' in r.value, 60,
                             "a faulty report on the topic")
        kill(running, next(s for s in running if s.name == "collector"))
        await asyncio.sleep(3)  # reports pile up unread
        add(running, tmp_path, env, "collector")
        await watch.wait_for(a_need("offline", TARGET), 90, "the need, after the restart")
        await watch.wait_for(is_success_of(watch, TARGET), 150, "the offline task")
        await watch.catch_up()
        reports = [r for r in watch.records if r.topic.endswith(Topic.NODE_REPORTS.value)]
        await until(lambda: processed(kafka_bootstrap, f"{namespace}.collector", reports), 60,
                    "the collector's group past every report read so far")
        once(watch, tmp_path)


@pytest.mark.timeout(300)
async def test_a_rebalance_storm_of_analyzers_and_executors_does_nothing_twice(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = fault_env(kafka_bootstrap, redis_url, namespace, tmp_path, "")
    async with (stack_with_fleet(redis_url, namespace, tmp_path, env, FLOW) as running,
                tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                    name(Topic.OPS_NODE_STATE, namespace),
                    name(Topic.OPS_NEEDS, namespace)) as watch):
        await all_up(watch)
        fleet.inject_fault(tmp_path, TARGET, xid=[79])
        for round_ in range(3):
            for service in ("analyzer", "executor"):
                first = next(s for s in running if s.name == service)
                add(running, tmp_path, env, service)
                await asyncio.sleep(1.5)
                kill(running, first)
            if round_ == 0:
                await watch.wait_for(drain_started(watch), 90, "the drain on the agent")
        await watch.wait_for(is_success_of(watch, TARGET), 200, "the offline task")
        await watch.catch_up()
        once(watch, tmp_path)
