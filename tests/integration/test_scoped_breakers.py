"""Node- and cluster-scoped circuit breakers on the real broker, Redis, services and agents.

Failed drains of one node, within the breaker's time window, open a node-scoped breaker: the
node gets no more ops tasks of any kind and no ML tasks while another node does, and an
audited reset gives it back. A cluster-scoped breaker holds every kind of task of its
cluster while another cluster's tasks run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from uuid import UUID, uuid4

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from redis.asyncio import Redis

from agent import fleet
from agent.ml.data import PIXEL_MAX, digits, split
from common.signing import ensure_signer_keys
from schemas.events.v1 import (
    MlTaskOutcome,
    MlTaskSubmitted,
    NeedKind,
    OpsNeed,
    TaskEvent,
    now_utc,
)
from schemas.topics import Topic
from services.scheduler.breaker_store import BreakerStore
from services.scheduler.settings import SchedulerSettings
from services.shared.audit import AuditLog
from services.shared.redis_client import Keys, connect_redis
from services.shared.registry import register
from tests.contracts.examples import example
from tests.integration.harness import (
    SMALL_POOL_SAFETY,
    Record,
    Tap,
    is_up,
    log_shows,
    name,
    producer,
    services,
    stack_env,
    tap,
    task_events_for,
    until,
)
from tests.integration.test_breaker import TICKS, alerts
from tests.integration.test_routing import ready_arms

MODELS = "digits-logreg@1"
# Two failed adjustments within ten minutes open a breaker.
BREAKER_ENV = {"SCHEDULER_BREAKER_CONSECUTIVE_FAILURES": "2",
               "SCHEDULER_BREAKER_WINDOW_S": "600", **SMALL_POOL_SAFETY}


async def raise_need(prod: AIOKafkaProducer, namespace: str, cluster: str, target: str,
                     kind: NeedKind = "offline", dry_run: bool = False) -> None:
    """A need as the analyzer raises it; the templater makes its task."""
    need = example("ops_need", OpsNeed).model_copy(update={
        "event_id": uuid4(), "occurred_at": now_utc(), "cluster_id": cluster,
        "subject": target, "target": target, "kind": kind, "dry_run": dry_run})
    await prod.send_and_wait(name(Topic.OPS_NEEDS, namespace),
                             need.model_dump_json().encode(), key=target.encode())


def task_ids(watch: Tap, target: str) -> list[UUID]:
    """The tasks of `target`, in the order they were queued."""
    seen: list[UUID] = []
    for e in task_events_for(watch, target):
        if e.task_id not in seen:
            seen.append(e.task_id)
    return seen


def trail(watch: Tap, task_id: UUID) -> list[str]:
    """The states task `task_id` went through, in order."""
    return [TaskEvent.model_validate_json(r.value).state for r in watch.records
            if r.topic.endswith(Topic.OPS_TASK_EVENTS.value)
            and TaskEvent.model_validate_json(r.value).task_id == task_id]


async def fail_twice(watch: Tap, prod: AIOKafkaProducer, namespace: str, cluster: str,
                     node: str) -> None:
    """Two offline needs of `node`, whose drain the agent fails: two failed tasks."""
    for n in (1, 2):
        await raise_need(prod, namespace, cluster, node)
        await watch.wait_for(failed_at_least(watch, node, n), 60,
                             f"offline task {n} of {node} to fail")


def failed_at_least(watch: Tap, node: str, n: int) -> Callable[[Record], bool]:
    """A predicate for `Tap.wait_for`: `n` tasks of `node` have failed."""
    return lambda _: sum(has_state_of(watch, t, "failed") for t in task_ids(watch, node)) >= n


def has_state_of(watch: Tap, task_id: UUID, state: str) -> bool:
    return state in trail(watch, task_id)


async def held_back(watch: Tap, log_path: Path, task_id: UUID, breaker: str) -> None:
    """The scheduler said TICKS times that `breaker` holds `task_id`; it was never dispatched."""
    await log_shows(log_path, lambda line: f"task {task_id} held back by breaker {breaker}"
                    in line, f"task {task_id} held back by {breaker}", count=TICKS)
    await watch.catch_up()
    assert "dispatched" not in trail(watch, task_id), trail(watch, task_id)


@asynccontextmanager
async def ml_client(bootstrap: str, namespace: str) -> AsyncIterator[
        tuple[AIOKafkaProducer, AIOKafkaConsumer]]:
    consumer = AIOKafkaConsumer(name(Topic.ML_TASKS_OUTCOMES, namespace),
                                bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        async with producer(bootstrap) as prod:
            yield prod, consumer
    finally:
        await consumer.stop()


INPUTS = [[float(round(v * PIXEL_MAX)) for v in row] for row in split(*digits())[2]]


async def ml_round(prod: AIOKafkaProducer, outcomes: AIOKafkaConsumer, namespace: str,
                   cluster: str, n: int) -> list[str]:
    """Submit `n` ML tasks and return the node of every attempt they made."""
    ids: set[UUID] = set()
    for i in range(n):
        task_id, now = uuid4(), now_utc()
        ids.add(task_id)
        event = MlTaskSubmitted(
            event_id=uuid4(), source="itest", occurred_at=now, cluster_id=cluster,
            subject=str(task_id), task_id=task_id, task_type="digits",
            input=INPUTS[i % len(INPUTS)], deadline=now + timedelta(seconds=10),
            submitted_by="itest")
        await prod.send_and_wait(name(Topic.ML_TASKS_SUBMITTED, namespace),
                                 event.model_dump_json().encode(), key=str(task_id).encode())
    nodes: list[str] = []
    finished: set[UUID] = set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60.0
    while finished != ids and loop.time() < deadline:
        for records in (await outcomes.getmany(timeout_ms=200)).values():
            for record in records:
                outcome = MlTaskOutcome.model_validate_json(record.value)
                if outcome.task_id not in ids:
                    continue
                if outcome.node_id is not None:
                    nodes.append(outcome.node_id)
                if outcome.final:
                    finished.add(outcome.task_id)
    assert finished == ids, f"{len(ids) - len(finished)} ML tasks unfinished"
    return nodes


async def models_ready(redis: Redis, keys: Keys, nodes: list[str]) -> bool:
    return {n for n, _, _ in await ready_arms(redis, keys)} >= set(nodes)


def scoped_env(bootstrap: str, redis_url: str, namespace: str, state_dir: Path, scope: str,
               **extra: str) -> dict[str, str]:
    """The stack's environment with the offline kind's breaker of `scope`."""
    return stack_env(bootstrap, redis_url, namespace, state_dir, AGENT_JOBS="",
                     WARDEN_LOG_LEVEL="INFO",
                     SCHEDULER_BREAKER_SCOPES=json.dumps({"offline": scope}),
                     **BREAKER_ENV, **extra)


@pytest.mark.timeout(600)
async def test_a_node_breaker_stops_the_nodes_ops_and_ml_tasks_until_reset(
        kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path) -> None:
    env = scoped_env(kafka_bootstrap, redis_url, namespace, tmp_path, "node",
                     AGENT_PEER_PROBES="0")
    trusted = ensure_signer_keys(tmp_path / "keys")
    redis, keys = connect_redis(redis_url), Keys(namespace)
    bad, good = "node-001", "node-002"
    async with services(env, tmp_path) as running:
        scheduler = next(s for s in running if s.name == "scheduler")
        fleet.fleet_up(2, 1, "itest", namespace, tmp_path, env, trusted, 1.0, models=MODELS)
        await register(redis_url, namespace, "itest", [bad, good])
        try:
            async with (tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                            name(Topic.OPS_NODE_STATE, namespace),
                            name(Topic.OPS_ALERTS, namespace)) as watch,
                        ml_client(kafka_bootstrap, namespace) as (prod, outcomes)):
                for node in (bad, good):
                    await watch.wait_for(is_up(node), 60, f"{node} up")
                await until(lambda: models_ready(redis, keys, [bad, good]), 90,
                            "both nodes serving their model")
                fleet.inject_fault(tmp_path, bad, fail_actions=["drain_node"])
                await asyncio.sleep(3.0)  # the agent reads its fault plan at each report (1 s)
                await fail_twice(watch, prod, namespace, "itest", bad)

                await watch.wait_for(lambda _: bool(alerts(watch)), 20, "the alert")
                [opened] = alerts(watch)
                assert (opened.kind, opened.dedup_key) == (
                    "breaker_open", f"breaker.itest.node.offline.{bad}")
                assert "(node scope)" in opened.message
                store = BreakerStore(redis, keys, SchedulerSettings().breaker_config)
                assert await store.holding("itest") == {f"offline@{bad}"}

                # Another kind on the stopped node is held; on the other node it runs.
                for node in (bad, good):
                    await raise_need(prod, namespace, "itest", node, "online", dry_run=True)
                await watch.wait_for(
                    lambda _: any(has_state_of(watch, t, "dispatched")
                                  for t in task_ids(watch, good)), 60,
                    f"the online task of {good} dispatched")
                await watch.wait_for(lambda _: len(task_ids(watch, bad)) == 3, 30,
                                     f"the online task of {bad} queued")
                held = task_ids(watch, bad)[-1]
                await held_back(watch, scheduler.log_path, held, f"itest/offline@{bad}")

                # No ML task lands on the stopped node; the other serves them all.
                nodes = await ml_round(prod, outcomes, namespace, "itest", 30)
                assert nodes
                assert set(nodes) == {good}, nodes

                reset = await store.reset("itest", f"offline@{bad}", "ada", "drain fixed",
                                          AuditLog(redis, keys))
                assert (reset.before.status, reset.after.status) == ("OPEN", "CLOSED")
                assert await store.holding("itest") == set()
                await watch.wait_for(lambda _: has_state_of(watch, held, "dispatched"), 30,
                                     "the held task dispatched after the reset")
                served: list[str] = []
                for _ in range(10):
                    served += await ml_round(prod, outcomes, namespace, "itest", 10)
                    if bad in served:
                        break
                assert bad in served, f"no ML task on {bad} after the reset: {served}"
        finally:
            fleet.fleet_down(tmp_path)
            await redis.aclose()


@pytest.mark.timeout(600)
async def test_a_cluster_breaker_holds_every_task_of_its_cluster_while_another_runs(
        kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path) -> None:
    env = scoped_env(kafka_bootstrap, redis_url, namespace, tmp_path, "cluster",
                     ANALYZER_POOL_PERIOD_S="1")
    trusted = ensure_signer_keys(tmp_path / "keys")
    west, east = tmp_path / "west", tmp_path / "east"
    redis, keys = connect_redis(redis_url), Keys(namespace)
    async with services(env, tmp_path, ("collector", "analyzer", "templater", "scheduler",
                                        "executor")) as running:
        scheduler = next(s for s in running if s.name == "scheduler")
        fleet.fleet_up(2, 1, "west", namespace, west, env, trusted, 1.0)
        fleet.fleet_up(1, 1, "east", namespace, east, env, trusted, 1.0, first=3)
        await register(redis_url, namespace, "west", ["node-001", "node-002"])
        await register(redis_url, namespace, "east", ["node-003"])
        try:
            async with (tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                            name(Topic.OPS_NODE_STATE, namespace),
                            name(Topic.OPS_ALERTS, namespace)) as watch,
                        producer(kafka_bootstrap) as prod):
                for node in ("node-001", "node-002", "node-003"):
                    await watch.wait_for(is_up(node), 60, f"{node} up")
                fleet.inject_fault(west, "node-001", fail_actions=["drain_node"])
                await asyncio.sleep(3.0)  # the agent reads its fault plan at each report (1 s)
                await fail_twice(watch, prod, namespace, "west", "node-001")
                await watch.wait_for(lambda _: bool(alerts(watch)), 20, "the alert")
                [opened] = alerts(watch)
                assert opened.dedup_key == "breaker.west.cluster.offline"
                store = BreakerStore(redis, keys, SchedulerSettings().breaker_config)
                assert await store.holding("west") == {"offline@*"}

                # Every kind, on another node of west: held. East: runs.
                await raise_need(prod, namespace, "west", "node-002", "online", dry_run=True)
                await raise_need(prod, namespace, "west", "node-002", "offline", dry_run=True)
                await raise_need(prod, namespace, "east", "node-003", "offline", dry_run=True)
                await watch.wait_for(
                    lambda _: any(has_state_of(watch, t, "dispatched")
                                  for t in task_ids(watch, "node-003")), 60,
                    "east's offline task dispatched")
                await watch.wait_for(lambda _: len(task_ids(watch, "node-002")) == 2, 30,
                                     "west's two tasks queued")
                for held in task_ids(watch, "node-002"):
                    await held_back(watch, scheduler.log_path, held, "west/offline@*")
                assert len(alerts(watch)) == 1
        finally:
            fleet.fleet_down(west)
            fleet.fleet_down(east)
            await redis.aclose()
