"""ML task routing on the real broker, Redis, router and agent processes serving real models.

A closed loop keeps a few tasks in flight (a new one is submitted as each finishes) and reads
every attempt's outcome. One test makes one model flaky on one node: its traffic must move
away and the measured success rate recover. The other adds a new model version on a new
node: it must start with little traffic (a cold arm takes one task at a time) and grow.

Nothing here waits a fixed time: each phase waits, with a generous deadline, until the
attempts it needs have been seen (counted in attempts, not seconds), then asserts on them.
How fast the router adapts is the benchmarks' business (bench/), not these tests'.
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
from common.signing import ensure_signer_keys
from schemas.events.v1 import MlTaskOutcome, MlTaskSubmitted, ModelSelected, now_utc
from schemas.topics import Topic
from services.router.registry import NodeModels
from services.shared.redis_client import Keys, connect_redis
from services.shared.registry import register
from services.store.db import migrate
from tests.integration.harness import ApiSite, name, read_to_end, services, stack_env, until
from tests.integration.test_console import wait_healthy
from warden import launcher

CLUSTER = "itest"
STANDARD = "digits-logreg@1,digits-mlp@1,digits-knn@1"
# Attempts are counted, not timed: a busy machine makes a phase longer, not different.
BASELINE = 150  # attempts before the fault (or the new version)
RECENT = 60     # the attempts a share is judged on while waiting for it
HOLD = 150      # the attempts after that on which the outcome is asserted


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
    runner: asyncio.Task[None] | None = None

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

    async def until(self, check: Callable[[], bool], timeout_s: float,
                    what: str | Callable[[], str]) -> None:
        """`harness.until` on this load's attempts; fails at once if the loop itself died."""
        def running_and() -> bool:
            if self.runner is not None and self.runner.done():
                self.runner.result()  # its exception, if it raised one
                raise AssertionError("the closed loop stopped")
            return check()
        await until(running_and, timeout_s, what)

    async def attempts(self, n: int, timeout_s: float = 120.0) -> None:
        """Wait until `n` attempts have been seen in all."""
        await self.until(lambda: len(self.seen) >= n, timeout_s,
                         lambda: f"{n} attempts (seen {len(self.seen)})")


def share(seen: list[Seen], match: Callable[[Seen], bool]) -> float:
    return sum(map(match, seen)) / len(seen) if seen else 0.0


def first_attempt_success(seen: list[Seen]) -> float:
    first = [s for s in seen if s.outcome.attempt == 1]
    return share(first, lambda s: s.outcome.outcome == "succeeded")


def describe(seen: list[Seen], watched: Callable[[Seen], bool], label: str) -> str:
    """The figures of a window of attempts, for failure messages."""
    return (f"{len(seen)} attempts, {label} {share(seen, watched):.1%}, first-attempt "
            f"success {first_attempt_success(seen):.1%}, by arm "
            f"{dict(Counter(s.arm for s in seen).most_common())}")


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
    runner = load.runner = asyncio.create_task(load.run())
    try:
        yield load
        load.submitting = False
        # The tasks still in flight end by their deadline (10 s) at the latest.
        try:
            await asyncio.wait_for(asyncio.shield(runner), timeout=120.0)
        except TimeoutError:
            raise AssertionError(f"{load.in_flight} tasks still unfinished 120 s after the "
                                 "last submission") from None
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
                           tuple[dict[str, str], list[Path], Redis, Keys]]:
    """The router and one agent per node of `fleet_models` (node -> AGENT_MODELS)."""
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
                    AGENT_PEER_PROBES="0", AGENT_JOBS="", **extra)
    trusted = ensure_signer_keys(tmp_path / "keys")
    redis = connect_redis(redis_url)
    keys = Keys(namespace)
    async with services(env, tmp_path, ("router",)):
        try:
            await start_agents(env, trusted, tmp_path, namespace, redis_url, fleet_models)
            expected = {(node, *m.split("@")) for node, ms in fleet_models.items()
                        for m in ms.split(",")}
            await until(lambda: _has(redis, keys, expected), 90,
                        "every agent reporting its models ready")
            yield env, trusted, redis, keys
        finally:
            fleet.fleet_down(tmp_path)
            await redis.aclose()


async def _has(redis: Redis, keys: Keys, expected: set[tuple[str, ...]]) -> bool:
    return expected <= {tuple(a) for a in await ready_arms(redis, keys)}


async def start_agents(env: dict[str, str], trusted: list[Path], tmp_path: Path, namespace: str,
                       redis_url: str, fleet_models: dict[str, str]) -> None:
    await register(redis_url, namespace, CLUSTER, list(fleet_models))
    for node, models in fleet_models.items():
        fleet.start_agent(node, gpus=1, cluster_id=CLUSTER, namespace=namespace,
                          state_dir=tmp_path, env=env, trusted_keys=trusted, interval_s=1.0,
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


@pytest.mark.timeout(900)  # the waits' own deadlines, not this, are what should fail
async def test_traffic_moves_away_from_a_flaky_model_and_success_recovers(
        kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path) -> None:
    nodes = {fleet.node_name(i): STANDARD for i in (1, 2, 3)}
    every_arm = {(node, *m.split("@")) for node, ms in nodes.items() for m in ms.split(",")}
    async with (routed_fleet(kafka_bootstrap, redis_url, namespace, tmp_path, nodes),
                closed_loop(kafka_bootstrap, namespace, concurrency=6) as load):

        # Before the fault the selector has a record, and has tried every arm of the fleet
        # (cold arms get their probes): it has somewhere to move the traffic to.
        await load.until(
            lambda: len(load.seen) >= BASELINE and {s.arm for s in load.seen} >= every_arm,
            120, lambda: (f"{BASELINE} attempts and every arm tried (now: "
                          f"{describe(load.seen, lambda s: False, '-')})"))
        baseline = list(load.seen)
        # The selector concentrates traffic on the arms with the best record, which ones
        # depends on the first few answers: the fault goes to the busiest arm, so that there
        # is traffic to move away. (Its share is then at least 1/9 by construction, so that
        # is not what the baseline is checked for below.)
        # (Busiest of the last RECENT attempts: the arm the selector favours now, not one it
        # favoured early and may have left since, which would get no traffic to fail.)
        bad_arm = Counter(s.arm for s in baseline[-RECENT:]).most_common(1)[0][0]
        bad_node, bad_model, bad_version = bad_arm
        assert bad_node is not None
        assert bad_model is not None
        assert bad_version is not None

        def is_bad(s: Seen) -> bool:
            return s.arm == bad_arm

        fault_at = time.monotonic()
        fault_index = len(load.seen)
        fleet.inject_fault(tmp_path, bad_node, model_faults=[
            ModelFault(model=f"{bad_model}@{bad_version}", failure_rate=0.7)])

        # The agent applies the fault plan at its next report: wait until it bites.
        await load.until(lambda: any(is_bad(s) and s.outcome.outcome == "failed"
                                     for s in load.seen[fault_index:]), 120,
                         lambda: ("a failed attempt of the faulted arm (since the fault: "
                                  f"{describe(load.seen[fault_index:], is_bad, 'flaky')})"))
        noticed = len(load.seen)

        def recent() -> list[Seen]:
            return load.seen[noticed:][-RECENT:]

        def recovered() -> bool:
            window = recent()
            return (len(window) >= RECENT and share(window, is_bad) <= 0.05
                    and first_attempt_success(window) >= 0.95)

        # Traffic moves away from it: wait until the last RECENT attempts show it...
        await load.until(recovered, 180, lambda: (
            f"the flaky arm's share of the last {RECENT} attempts to fall to 5 % and "
            f"first-attempt success to reach 95 % (now: {describe(recent(), is_bad, 'flaky')})"))
        moved = len(load.seen)
        # ...then judge the HOLD attempts after that, a window of its own (not the one the
        # wait stopped at, which may be a lucky stretch), long enough to show whether the
        # traffic stays away, not only that it left. Whether the selector comes back to the
        # arm for a trial in that window depends on its quarantine and its decayed record,
        # so it is allowed, not awaited: a trial or two stays under 5 %.
        await load.attempts(moved + HOLD)
        late = load.seen[moved:moved + HOLD]
    start = baseline[0].at
    for line in summary(load, start, 3.0, is_bad, "flaky arm"):
        print(line)
    print(f"fault at {fault_at - start:.1f}s (attempt {fault_index}), first failure seen at "
          f"attempt {noticed}, moved away by attempt {moved}; "
          f"baseline {describe(baseline, is_bad, 'flaky')}; "
          f"late {describe(late, is_bad, 'flaky')}")

    # Before the fault everything succeeded.
    assert all(s.outcome.outcome == "succeeded" for s in baseline), describe(
        baseline, is_bad, "flaky")
    # The fault was seen for what it is: a model fault, counted against the model.
    failures = [s.outcome for s in load.seen[fault_index:] if s.outcome.outcome == "failed"]
    assert failures
    assert {(o.node_id, o.model, o.cause, o.attributed_to) for o in failures} == {
        (bad_node, bad_model, "model_fault", "model")}
    # Traffic stayed away from it, and the measured success rate stayed recovered.
    assert share(late, is_bad) <= 0.05, describe(late, is_bad, "flaky")
    assert first_attempt_success(late) >= 0.95, describe(late, is_bad, "flaky")
    # Failed attempts were retried elsewhere: every task the fault hit still succeeded,
    # unless the retry budget (docs/routing-policy.md §Retries) said no...
    hit = {s.outcome.task_id for s in load.seen[fault_index:] if s.outcome.outcome == "failed"}
    ends = {task_id: load.finished[task_id] for task_id in hit}
    print(f"tasks the fault hit: {len(hit)}, "
          f"{dict(Counter(f'{o.state}: {o.reason}' for o in ends.values()))}")
    unsaved = {o.reason for o in ends.values()
               if o.state != "succeeded" and "no retry: budget" not in o.reason}
    assert not unsaved, unsaved
    assert any(o.state == "succeeded" and o.attempt > 1 for o in ends.values())
    attempts = {(s.outcome.task_id, s.outcome.attempt): s for s in load.seen}
    for (task_id, number), s in attempts.items():
        retry = attempts.get((task_id, number + 1))
        if s.outcome.outcome == "failed" and retry is not None:
            assert retry.arm != s.arm, (s.outcome, retry.outcome)
    # ...and (nearly) every task submitted after the fault succeeded.
    after = [o for task_id, o in load.finished.items() if load.submitted[task_id] >= fault_at]
    assert len(after) >= HOLD
    assert sum(o.state == "succeeded" for o in after) >= 0.99 * len(after), (
        Counter(o.state for o in after))


@pytest.mark.timeout(900)
async def test_a_new_model_version_starts_with_little_traffic_and_grows(
        kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path) -> None:
    nodes = {"node-001": "digits-mlp@1", "node-002": "digits-mlp@1",
             "node-003": "digits-knn@1"}
    # Every model takes 300 ms an answer (as a real one on a busy GPU might), so that a dozen
    # tasks are really in flight at once: only then does "one at a time" limit anything.
    slow = [ModelFault(failure_rate=0.0, latency_ms=300.0)]
    for node in (*nodes, "node-004"):
        fleet.inject_fault(tmp_path, node, model_faults=slow)

    def is_new(s: Seen) -> bool:
        return s.outcome.version == "2"

    async with routed_fleet(kafka_bootstrap, redis_url, namespace, tmp_path, nodes,
                            AGENT_MODEL_MAX_CONCURRENCY="6") as (env, trusted, redis, keys):
        decisions = AIOKafkaConsumer(name(Topic.ML_DECISIONS, namespace),
                                     bootstrap_servers=kafka_bootstrap,
                                     auto_offset_reset="earliest", enable_auto_commit=False,
                                     max_partition_fetch_bytes=4 * 1024 * 1024)
        await decisions.start()
        try:
            async with closed_loop(kafka_bootstrap, namespace, concurrency=12) as load:
                # The old arms have a record before the new one comes.
                await load.attempts(BASELINE // 2)
                await start_agents(env, trusted, tmp_path, namespace, redis_url,
                                   {"node-004": "digits-mlp@2"})
                await until(lambda: _has(redis, keys, {("node-004", "digits-mlp", "2")}), 90,
                            "the new version ready")
                await load.until(lambda: any(map(is_new, load.seen)), 60,
                                 "the new version's first task")
                first_new = next(i for i, s in enumerate(load.seen) if is_new(s))

                def recent() -> list[Seen]:
                    return load.seen[first_new + 40:][-RECENT:]

                # It grows: wait until the last RECENT attempts give it a real share...
                await load.until(
                    lambda: len(recent()) >= RECENT and share(recent(), is_new) >= 0.15, 180,
                    lambda: (f"the new version's share of the last {RECENT} attempts to reach"
                             f" 15 % (now: {describe(recent(), is_new, 'new version')})"))
                grown = len(load.seen)
                # ...and judge the HOLD attempts after that (a window of their own).
                await load.attempts(grown + HOLD)
                late = load.seen[grown:grown + HOLD]
            new_choices = await read_new_version_choices(decisions)
        finally:
            await decisions.stop()

    early = load.seen[first_new:first_new + 40]
    for line in summary(load, load.seen[first_new].at, 2.0, is_new, "new version"):
        print(line)
    print(f"new version: early share {share(early, is_new):.1%}, late {share(late, is_new):.1%}"
          f" (fair 25%), {len(load.seen)} attempts; grown by attempt {grown - first_new} "
          "after its first")
    # Little traffic at first: a cold arm takes one task at a time...
    assert share(early, is_new) <= 0.15, describe(early, is_new, "new version")
    first_decisions = new_choices[:5]
    assert first_decisions
    for decision in first_decisions:
        verdict = next(c for c in decision.candidates if c.arm == decision.chosen)
        assert (verdict.state, verdict.inflight) == ("cold", 0)
    # ...and more as it succeeds: close to a fair share once it has a record.
    assert share(late, is_new) >= 0.15, describe(late, is_new, "new version")
    assert share(late, is_new) > share(early, is_new)
    assert all(s.outcome.outcome == "succeeded" for s in load.seen if is_new(s))


async def read_new_version_choices(consumer: AIOKafkaConsumer) -> list[ModelSelected]:
    """Every decision published so far that chose version 2, in order."""
    found: list[ModelSelected] = []
    for record in await read_to_end(consumer, 120, "the decisions"):
        if b'"version":"2"' in record.value:
            event = ModelSelected.model_validate_json(record.value)
            if event.version == "2":
                found.append(event)
    return sorted(found, key=lambda e: e.now)


async def test_a_task_submitted_through_the_api_is_recorded_with_where_it_ran(
        kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path) -> None:
    site, token = ApiSite.at(tmp_path), "operator-token-0123456789"
    base, database_url = site.base, site.database_url
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
                    AGENT_PEER_PROBES="0", AGENT_JOBS="",
                    **site.env(f"{token}:olivia:operator"))
    await migrate(database_url)  # once, before the store and the API both start
    trusted = ensure_signer_keys(tmp_path / "keys")
    redis, keys = connect_redis(redis_url), Keys(namespace)
    _, _, x_test, _ = split(*digits())
    digit = [float(round(v * PIXEL_MAX)) for v in x_test[3]]
    async with services(env, tmp_path, ("router", "store", launcher.API)):
        try:
            await start_agents(env, trusted, tmp_path, namespace, redis_url,
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
    # The success counted once (decaying since: halved every half_life_s = 300 s, so between
    # a half and one whatever the time it took to get here), the bad input not at all.
    n_eff = sum(a["n_eff"] for a in arms.values())
    assert 0.5 < n_eff <= 1.0 + 1e-6, n_eff
