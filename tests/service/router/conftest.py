"""A router on the real Redis with a recording bus, a settable clock and a served registry."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast
from uuid import UUID, uuid4

import pytest
from redis.asyncio import Redis

from common.messaging import EventBus
from common.signing import (
    CommandVerifier,
    ensure_keypair,
    signer_from_file,
    verifier_from_files,
)
from schemas.envelope import Envelope
from schemas.events.v1 import (
    CommandPayload,
    CommandResult,
    InferenceCause,
    InferenceOutput,
    MlTaskOutcome,
    MlTaskSubmitted,
    ModelSelected,
    NodeReport,
    RunInference,
    ServedModel,
)
from schemas.topics import Topic
from services.router.handlers import Router
from services.router.registry import Registry
from services.router.settings import RouterSettings
from services.router.stats_store import StatsStore
from services.shared.redis_client import Keys
from services.shared.registry import register_nodes
from tests.contracts.examples import DIGIT, examples
from tests.unit.router.helpers import served

CLUSTER = "local"
T0 = datetime(2026, 11, 30, 8, 0, 0, tzinfo=UTC)


class Clock:
    """Epoch seconds the test moves on by hand."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start.timestamp()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    @property
    def moment(self) -> datetime:
        return datetime.fromtimestamp(self.now, UTC)


class RecordingBus(EventBus):
    """Keeps what would be published; can be made to fail (Kafka down)."""

    def __init__(self) -> None:
        super().__init__(cast(Any, None), "")
        self.sent: list[tuple[Topic, Envelope]] = []
        self.down = False

    async def publish(self, topic: Topic, event: Envelope) -> None:
        if self.down:
            raise ConnectionError("Kafka is down")
        self.sent.append((topic, event))


STANDARD = (("digits-logreg", "1", "logreg"), ("digits-mlp", "1", "mlp"),
            ("digits-knn", "1", "knn"))


@dataclass
class Harness:
    """One or more routers sharing Redis, and the fleet they route to."""

    routers: list[Router]
    bus: RecordingBus
    clock: Clock
    verifier: CommandVerifier
    keys: Keys
    redis: Redis
    seqs: dict[str, int] = field(default_factory=dict)

    @property
    def router(self) -> Router:
        return self.routers[0]

    async def report(self, node: str, models: Sequence[ServedModel], *,
                     mode: str = "active", interval_s: float = 1.0) -> None:
        base = examples()["node_report"]
        self.seqs[node] = self.seqs.get(node, 0) + 1
        await register_nodes(self.redis, self.keys, CLUSTER, [node])
        report = NodeReport.model_validate(base.model_dump() | {
            "event_id": uuid4(), "subject": node, "node_id": node, "seq": self.seqs[node],
            "occurred_at": self.clock.moment, "mode": mode, "interval_s": interval_s,
            "models": [m.model_dump() for m in models]})
        await self.router.on_report(report)

    async def fleet(self, nodes: Sequence[str] = ("node-001", "node-002", "node-003"),
                    models: Sequence[tuple[str, str, str]] = STANDARD, limit: int = 4) -> None:
        for node in nodes:
            await self.report(node, [served(m, v, f, limit=limit) for m, v, f in models])

    def submit_event(self, *, deadline_s: float = 10.0, critical: bool = False,
                     task_id: UUID | None = None) -> MlTaskSubmitted:
        task_id = task_id or uuid4()
        return MlTaskSubmitted(
            event_id=uuid4(), source="api", occurred_at=self.clock.moment, cluster_id=CLUSTER,
            subject=str(task_id), task_id=task_id, task_type="digits", input=DIGIT,
            deadline=self.clock.moment + timedelta(seconds=deadline_s), critical=critical,
            submitted_by="alice")

    async def submit(self, router: int = 0, **fields: Any) -> MlTaskSubmitted:
        task = self.submit_event(**fields)
        await self.routers[router].on_submitted(task)
        return task

    # ------------------------------------------------------------ what was sent

    def events(self, topic: Topic) -> list[Envelope]:
        return [e for t, e in self.bus.sent if t == topic]

    def decisions(self, task_id: UUID | None = None) -> list[ModelSelected]:
        return [e for e in self.events(Topic.ML_DECISIONS)
                if isinstance(e, ModelSelected) and (task_id is None or e.task_id == task_id)]

    def outcomes(self, task_id: UUID | None = None) -> list[MlTaskOutcome]:
        return [e for e in self.events(Topic.ML_TASKS_OUTCOMES)
                if isinstance(e, MlTaskOutcome) and (task_id is None or e.task_id == task_id)]

    def commands(self, task_id: UUID | None = None) -> list[CommandPayload]:
        found = []
        for event in self.events(Topic.NODE_COMMANDS):
            payload = self.verifier.verify(cast(Any, event))
            if task_id is None or payload.task_id == task_id:
                found.append(payload)
        return found

    async def answer(self, payload: CommandPayload, cause: InferenceCause | None = None, *,
                     outcome: str | None = None, router: int = 0,
                     duplicate: bool = False, sender: str | None = None) -> None:
        """The agent's answer to a run_inference command (`sender`: from another node)."""
        action = payload.action
        assert isinstance(action, RunInference)
        inference = InferenceOutput(
            task_id=action.task_id, attempt=action.attempt, task_type=action.task_type,
            model=action.model, version=action.version, family=None, cause=cause,
            latency_ms=0.5, prediction=None if cause else 0,
            confidence=None if cause else 0.99)
        result = CommandResult(
            event_id=uuid4(), source=f"agent-{payload.node_id}", occurred_at=self.clock.moment,
            cluster_id=CLUSTER, subject=sender or payload.node_id, command_id=payload.command_id,
            node_id=sender or payload.node_id, task_id=payload.task_id, action="run_inference",
            outcome=cast(Any, outcome or ("succeeded" if cause is None else "failed")),
            reason=cause or "", duplicate=duplicate,
            inference=None if outcome == "rejected" else inference)
        await self.routers[router].on_result(result)


def make_router(redis: Redis, keys: Keys, bus: RecordingBus, clock: Clock, key_file: Path,
                seed: int, **settings: Any) -> Router:
    config = RouterSettings(**settings)
    return Router(config, redis, keys, bus, signer_from_file(key_file),
                  Registry(redis, keys, cache_s=0.0, forget_after_s=600.0),
                  StatsStore(keys, 3_600), rng=random.Random(seed), clock=clock)


@pytest.fixture
def make_harness(redis: Redis, keys: Keys, tmp_path: Path) -> Any:
    private, public = ensure_keypair(tmp_path / "keys", "router")

    def build(instances: int = 1, **settings: Any) -> Harness:
        bus, clock = RecordingBus(), Clock()
        routers = [make_router(redis, keys, bus, clock, private, seed=i, **settings)
                   for i in range(instances)]
        return Harness(routers, bus, clock, verifier_from_files([public]), keys, redis)

    return build


@pytest.fixture
def harness(make_harness: Any) -> Harness:
    built: Harness = make_harness()
    return built
