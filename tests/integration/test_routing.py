"""ML task routing on the real broker, Redis, router and agent processes serving real models.

A closed loop keeps a few tasks in flight (a new one is submitted as each finishes) and reads
every attempt's outcome. One test makes one model flaky on one node: its traffic must move
away and the measured success rate recover. The other adds a new model version on a new
node: it must start with little traffic (a cold arm takes one task at a time) and grow.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from redis.asyncio import Redis

from agent import fleet
from agent.faults import ModelFault
from agent.ml.data import PIXEL_MAX, digits, split
from schemas.events.v1 import MlTaskOutcome, MlTaskSubmitted, ModelSelected, now_utc
from schemas.topics import Topic
from services import launcher
from services.router.registry import NodeModels
from services.shared.redis_client import Keys, connect_redis
from services.shared.registry import register
from services.shared.signing import ensure_keypair
from services.store.db import migrate
from tests.integration.harness import name, services, stack_env, until
from tests.integration.test_console import free_port, wait_healthy

pytestmark = pytest.mark.integration

CLUSTER = "itest"
STANDARD = "digits-logreg@1,digits-mlp@1,digits-knn@1"


@dataclass(frozen=True)
class Seen:
    """One attempt's outcome, when the test read it."""

    at: float
    outcome: MlTaskOutcome

    @property
    def arm(self) -> tuple[str | None, str | None, str | None]:
        o = self.outcome
        return o.node_id, o.model, o.version


@dataclass
class Load:
    """Keeps `concurrency` tasks in flight and records every attempt's outcome."""

    producer: AIOKafkaProducer
    outcomes: AIOKafkaConsumer
    namespace: str
    concurrency: int
    deadline_s: float = 10.0
    seen: list[Seen] = field(default_factory=list)
    submitted: dict[UUID, float] = field(default_factory=dict)
    finished: dict[UUID, MlTaskOutcome] = field(default_factory=dict)
    submitting: bool = True
    inputs: list[list[float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        _, _, x_test, _ = split(*digits())
        self.inputs = [[float(round(v * PIXEL_MAX)) for v in row] for row in x_test]

    @property
    def in_flight(self) -> int:
        return len(self.submitted) - len(self.finished)

    async def submit(self) -> None:
        task_id = uuid4()
        now = now_utc()
        event = MlTaskSubmitted(
            event_id=uuid4(), source="itest", occurred_at=now, cluster_id=CLUSTER,
            subject=str(task_id), task_id=task_id, task_type="digits",
            input=self.inputs[len(self.submitted) % len(self.inputs)],
            deadline=now + timedelta(seconds=self.deadline_s), submitted_by="itest")
        self.submitted[task_id] = time.monotonic()
        await self.producer.send_and_wait(name(Topic.ML_TASKS_SUBMITTED, self.namespace),
                                          event.model_dump_json().encode(),
                                          key=str(task_id).encode())

    async def run(self) -> None:
        while self.submitting or self.in_flight:
            while self.submitting and self.in_flight < self.concurrency:
                await self.submit()
            batches = await self.outcomes.getmany(timeout_ms=100)
            for records in batches.values():
                for record in records:
                    outcome = MlTaskOutcome.model_validate_json(record.value)
                    if outcome.task_id not in self.submitted:
                        continue
                    self.seen.append(Seen(time.monotonic(), outcome))
                    if outcome.final:
                        self.finished.setdefault(outcome.task_id, outcome)

    def window(self, start: float, end: float = float("inf")) -> list[Seen]:
        return [s for s in self.seen if start <= s.at < end]


def share(seen: list[Seen], match: Callable[[Seen], bool]) -> float:
    return sum(map(match, seen)) / len(seen) if seen else 0.0


def first_attempt_success(seen: list[Seen]) -> float:
    first = [s for s in seen if s.outcome.attempt == 1]
    return share(first, lambda s: s.outcome.outcome == "succeeded")


@asynccontextmanager
async def closed_loop(bootstrap: str, namespace: str,
                      concurrency: int) -> AsyncIterator[Load]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True,
                                acks="all")
    consumer = AIOKafkaConsumer(name(Topic.ML_TASKS_OUTCOMES, namespace),
                                bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await producer.start()
    await consumer.start()
    load = Load(producer, consumer, namespace, concurrency)
    runner = asyncio.create_task(load.run())
    try:
        yield load
        load.submitting = False
        await asyncio.wait_for(asyncio.shield(runner), timeout=60.0)
    finally:
        load.submitting = False
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await runner
        await consumer.stop()
        await producer.stop()


async def ready_arms(redis: Redis, keys: Keys) -> set[tuple[str, str, str]]:
    """(node, model, version) of every model a node reports ready."""
    raw = await redis.hgetall(keys.ml_registry(CLUSTER))
    entries = [NodeModels.model_validate_json(body) for body in raw.values()]
    return {(e.node, m.model, m.version) for e in entries for m in e.models
            if m.state == "ready"}


@asynccontextmanager
async def routed_fleet(kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path,
                       fleet_models: dict[str, str], **extra: str) -> AsyncIterator[
                           tuple[dict[str, str], Path, Redis, Keys]]:
    """The router and one agent per node of `fleet_models` (node -> AGENT_MODELS)."""
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
                    AGENT_PEER_PROBES="0", AGENT_JOBS="", **extra)
    _, public = ensure_keypair(tmp_path / "keys")
    redis = connect_redis(redis_url)
    keys = Keys(namespace)
    async with services(env, tmp_path, ("router",)):
        try:
            await start_agents(env, public, tmp_path, namespace, redis_url, fleet_models)
            expected = {(node, *m.split("@")) for node, ms in fleet_models.items()
                        for m in ms.split(",")}
            await until(lambda: _has(redis, keys, expected), 90,
                        "every agent reporting its models ready")
            yield env, public, redis, keys
        finally:
            fleet.fleet_down(tmp_path)
            await redis.aclose()


async def _has(redis: Redis, keys: Keys, expected: set[tuple[str, ...]]) -> bool:
    return expected <= {tuple(a) for a in await ready_arms(redis, keys)}


async def start_agents(env: dict[str, str], public: Path, tmp_path: Path, namespace: str,
                       redis_url: str, fleet_models: dict[str, str]) -> None:
    await register(redis_url, namespace, CLUSTER, list(fleet_models))
    for node, models in fleet_models.items():
        fleet.start_agent(node, gpus=1, cluster_id=CLUSTER, namespace=namespace,
                          state_dir=tmp_path, env=env, trusted_keys=[public], interval_s=1.0,
                          jobs="", models=models)


def summary(load: Load, start: float, step_s: float, watched: Callable[[Seen], bool],
            label: str) -> list[str]:
    """Per window: attempts, the watched arm's share, first-attempt success (on -s)."""
    lines = []
    end = max((s.at for s in load.seen), default=start)
    t = start
    while t < end:
        seen = load.window(t, t + step_s)
        lines.append(f"{t - start:6.1f}s  attempts {len(seen):4d}  {label} "
                     f"{share(seen, watched):6.1%}  first-attempt success "
                     f"{first_attempt_success(seen):6.1%}")
        t += step_s
    return lines


async def test_traffic_moves_away_from_a_flaky_model_and_success_recovers(
        kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path) -> None:
    nodes = {fleet.node_name(i): STANDARD for i in (1, 2, 3)}
    async with (routed_fleet(kafka_bootstrap, redis_url, namespace, tmp_path, nodes),
                closed_loop(kafka_bootstrap, namespace, concurrency=6) as load):

        await asyncio.sleep(8.0)
        baseline = list(load.seen)
        # The selector concentrates traffic on the arms with the best record, which ones
        # depends on the first few answers: the fault goes to the busiest arm, so that there
        # is traffic to move away.
        bad_arm = Counter(s.arm for s in baseline).most_common(1)[0][0]
        bad_node, bad_model, bad_version = bad_arm
        assert bad_node is not None
        assert bad_model is not None
        assert bad_version is not None

        def is_bad(s: Seen) -> bool:
            return s.arm == bad_arm

        fault_at = time.monotonic()
        fleet.inject_fault(tmp_path, bad_node, model_faults=[
            ModelFault(model=f"{bad_model}@{bad_version}", failure_rate=0.7)])
        await asyncio.sleep(22.0)
    for line in summary(load, fault_at - 8.0, 3.0, is_bad, "flaky arm"):
        print(line)

    # Before the fault every arm took its share and everything succeeded.
    assert len(baseline) >= 40
    assert share(baseline, is_bad) > 0.02
    assert first_attempt_success(baseline) == 1.0
    # The fault was seen for what it is: a model fault, counted against the model.
    failures = [s.outcome for s in load.window(fault_at) if s.outcome.outcome == "failed"]
    assert failures
    assert {(o.node_id, o.model, o.cause, o.attributed_to) for o in failures} == {
        (bad_node, bad_model, "model_fault", "model")}
    # Traffic moved away from it, and the measured success rate recovered.
    late = load.window(fault_at + 12.0)
    assert len(late) >= 40
    assert share(late, is_bad) <= 0.05
    assert first_attempt_success(late) >= 0.95
    # Failed attempts were retried elsewhere: (nearly) every task still succeeded.
    after = [o for o in load.finished.values() if o.occurred_at.timestamp() > 0]
    assert sum(o.state == "succeeded" for o in after) >= 0.99 * len(after)


async def test_a_new_model_version_starts_with_little_traffic_and_grows(
        kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path) -> None:
    nodes = {"node-001": "digits-mlp@1", "node-002": "digits-mlp@1",
             "node-003": "digits-knn@1"}
    # Every model takes 300 ms an answer (as a real one on a busy GPU might), so that a dozen
    # tasks are really in flight at once: only then does "one at a time" limit anything.
    slow = [ModelFault(failure_rate=0.0, latency_ms=300.0)]
    for node in (*nodes, "node-004"):
        fleet.inject_fault(tmp_path, node, model_faults=slow)
    async with routed_fleet(kafka_bootstrap, redis_url, namespace, tmp_path, nodes,
                            AGENT_MODEL_MAX_CONCURRENCY="6") as (env, public, redis, keys):
        decisions = AIOKafkaConsumer(name(Topic.ML_DECISIONS, namespace),
                                     bootstrap_servers=kafka_bootstrap,
                                     auto_offset_reset="earliest", enable_auto_commit=False,
                                     max_partition_fetch_bytes=4 * 1024 * 1024)
        await decisions.start()
        try:
            async with closed_loop(kafka_bootstrap, namespace, concurrency=12) as load:
                await asyncio.sleep(6.0)
                await start_agents(env, public, tmp_path, namespace, redis_url,
                                   {"node-004": "digits-mlp@2"})
                await until(lambda: _has(redis, keys, {("node-004", "digits-mlp", "2")}), 60,
                            "the new version ready")
                await until(lambda: any(s.outcome.version == "2" for s in load.seen), 30,
                            "the new version's first task")
                await asyncio.sleep(20.0)
            new_choices = await read_new_version_choices(decisions)
        finally:
            await decisions.stop()

    def is_new(s: Seen) -> bool:
        return s.outcome.version == "2"

    first_new = next(i for i, s in enumerate(load.seen) if is_new(s))
    early = load.seen[first_new:first_new + 40]
    late = load.seen[-max(len(load.seen) // 4, 40):]
    for line in summary(load, load.seen[first_new].at, 2.0, is_new, "new version"):
        print(line)
    print(f"new version: early share {share(early, is_new):.1%}, late {share(late, is_new):.1%}"
          f" (fair 25%), {len(load.seen)} attempts")
    # Little traffic at first: a cold arm takes one task at a time...
    assert share(early, is_new) <= 0.15
    first_decisions = new_choices[:5]
    assert first_decisions
    for decision in first_decisions:
        verdict = next(c for c in decision.candidates if c.arm == decision.chosen)
        assert (verdict.state, verdict.inflight) == ("cold", 0)
    # ...and more as it succeeds: close to a fair share once it has a record.
    assert share(late, is_new) >= 0.15
    assert share(late, is_new) > share(early, is_new)
    assert all(s.outcome.outcome == "succeeded" for s in load.seen if is_new(s))


async def read_new_version_choices(consumer: AIOKafkaConsumer) -> list[ModelSelected]:
    """Every decision that chose version 2, in order."""
    found: list[ModelSelected] = []
    idle = 0
    while idle < 3:
        batches = await consumer.getmany(timeout_ms=500)
        if not batches:
            idle += 1
            continue
        idle = 0
        for records in batches.values():
            for record in records:
                if b'"version":"2"' in record.value:
                    event = ModelSelected.model_validate_json(record.value)
                    if event.version == "2":
                        found.append(event)
    return sorted(found, key=lambda e: e.now)


async def test_a_task_submitted_through_the_api_is_recorded_with_where_it_ran(
        kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path) -> None:
    port, token = free_port(), "operator-token-0123456789"
    base = f"http://127.0.0.1:{port}"
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'warden.db'}"
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
                    AGENT_PEER_PROBES="0", AGENT_JOBS="", DATABASE_URL=database_url,
                    API_HOST="127.0.0.1", API_PORT=str(port), API_TOKENS=f"{token}:olivia:operator")
    await migrate(database_url)  # once, before the store and the API both start
    _, public = ensure_keypair(tmp_path / "keys")
    redis, keys = connect_redis(redis_url), Keys(namespace)
    _, _, x_test, _ = split(*digits())
    digit = [float(round(v * PIXEL_MAX)) for v in x_test[3]]
    async with services(env, tmp_path, ("router", "store", launcher.API)):
        try:
            await start_agents(env, public, tmp_path, namespace, redis_url,
                               {"node-001": "digits-knn@1,digits-mlp@1"})
            await wait_healthy(base, 60)
            await until(lambda: _has(redis, keys, {("node-001", "digits-knn", "1"),
                                                   ("node-001", "digits-mlp", "1")}), 90,
                        "the models ready")
            async with httpx.AsyncClient(base_url=base, timeout=10.0,
                                         headers={"Authorization": f"Bearer {token}"}) as api:

                async def run(values: list[float]) -> dict[str, Any]:
                    accepted = await api.post("/api/ml/tasks", json={
                        "task_type": "digits", "input": values, "deadline_s": 10.0})
                    assert accepted.status_code == 202, accepted.text
                    task_id = accepted.json()["task_id"]
                    found: dict[str, Any] = {}

                    async def final() -> bool:
                        response = await api.get(f"/api/ml/tasks/{task_id}")
                        found.update(response.json() if response.status_code == 200 else {})
                        return found.get("state") in ("succeeded", "failed")

                    await until(final, 60, f"task {task_id} recorded as done")
                    return found

                done = await run(digit)
                bad = await run(digit[:63])
                models = (await api.get("/api/ml/models")).json()
        finally:
            fleet.fleet_down(tmp_path)
            await redis.aclose()
    assert (done["state"], done["node_id"], done["attempts"]) == ("succeeded", "node-001", 1)
    assert done["model"] in ("digits-knn", "digits-mlp")
    assert done["prediction"] in range(10)
    [attempt] = done["attempt_list"]
    assert attempt["status"] == "selected"
    assert {c["model"] for c in attempt["candidates"]} == {"digits-knn:1", "digits-mlp:1"}
    # Bad input fails at once (no retry), counted against nobody.
    assert (bad["state"], bad["cause"], bad["attempts"]) == ("failed", "bad_input", 1)
    assert bad["attempt_list"][0]["attributed_to"] == "neither"
    arms = {a["model"]: a for a in models["arms"]}
    assert set(arms) == {"digits-knn", "digits-mlp"}
    assert all(a["ready"] for a in arms.values())
    # The success counted (decaying since), the bad input not at all.
    assert sum(a["n_eff"] for a in arms.values()) == pytest.approx(1.0, abs=0.05)
