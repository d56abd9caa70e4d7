"""The stack a replay runs against: a namespace with its own collector and analyzer
processes on the real broker and Redis, and taps on their output."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from uuid import uuid4

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient

from bench.common import percentile
from bench.fleet_sim import drop_namespace
from common.messaging import ensure_topics
from common.reportauth import ensure_master, master_path
from common.signing import ensure_signer_keys
from schemas.envelope import Envelope
from schemas.events.v1 import NodeState, OpsNeed, PoolHealth
from schemas.topics import Topic, topic_name
from services.shared.registry import register
from warden import launcher

CLUSTER = "replay"


@dataclass
class Seen:
    """What the replay read back from the services' output topics, with arrival times."""

    needs: list[OpsNeed] = field(default_factory=list)
    need_arrived: dict[str, float] = field(default_factory=dict)  # event id -> epoch s
    health: list[PoolHealth] = field(default_factory=list)
    states: list[NodeState] = field(default_factory=list)


async def _cancel(task: asyncio.Task[None] | None) -> None:
    """Stop a background reader and wait until it has."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class Tap:
    """Reads needs, pool health and node states of a namespace in the background."""

    def __init__(self, bootstrap: str, namespace: str) -> None:
        self.topics: dict[str, type[Envelope]] = {
            topic_name(Topic.OPS_NEEDS, namespace): OpsNeed,
            topic_name(Topic.OPS_POOL_HEALTH, namespace): PoolHealth,
            topic_name(Topic.OPS_NODE_STATE, namespace): NodeState,
        }
        self.seen = Seen()
        self._consumer = AIOKafkaConsumer(
            *self.topics, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
            enable_auto_commit=False)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._consumer.start()
        self._task = asyncio.create_task(self._read(), name="tap")

    async def stop(self) -> None:
        await _cancel(self._task)
        await self._consumer.stop()

    async def _read(self) -> None:
        while True:
            for records in (await self._consumer.getmany(timeout_ms=200)).values():
                for record in records:
                    model = self.topics[record.topic]
                    event = model.model_validate_json(record.value)
                    if isinstance(event, OpsNeed):
                        self.seen.needs.append(event)
                        self.seen.need_arrived[str(event.event_id)] = time.time()
                    elif isinstance(event, PoolHealth):
                        self.seen.health.append(event)
                    elif isinstance(event, NodeState):
                        self.seen.states.append(event)

    def check(self) -> None:
        if self._task is not None and self._task.done() and not self._task.cancelled():
            raise RuntimeError("tap failed") from self._task.exception()


class LagSampler:
    """The services' consumer lag (messages read but not yet committed), sampled every
    `period_s`: when a run falls behind, this says which stage did."""

    GROUPS: dict[str, Topic] = {
        "collector": Topic.NODE_REPORTS,
        "collector-probes": Topic.NODE_COMMAND_RESULTS,
        "analyzer-samples": Topic.OPS_SAMPLES,
    }

    def __init__(self, bootstrap: str, namespace: str, period_s: float = 2.0) -> None:
        self.namespace = namespace
        self.period_s = period_s
        self.samples: dict[str, list[float]] = {}
        self._admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._admin.start()
        await self._consumer.start()
        self._task = asyncio.create_task(self._sample(), name="lag-sampler")

    async def stop(self) -> None:
        await _cancel(self._task)
        await self._consumer.stop()
        await self._admin.close()

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            for group in self.GROUPS:
                # A diagnostic: a failed sample is skipped, it never stops the run.
                with contextlib.suppress(Exception):
                    committed = await self._admin.list_consumer_group_offsets(
                        f"{self.namespace}.{group}")
                    if not committed:
                        continue
                    ends = await self._consumer.end_offsets(list(committed))
                    lag = sum(max(0, ends[tp] - meta.offset) for tp, meta in committed.items()
                              if meta.offset >= 0)
                    self.samples.setdefault(group, []).append(float(lag))

    def summary(self) -> dict[str, dict[str, float]]:
        """Per group: the median and largest lag sampled, in messages."""
        return {group: {"p50": percentile(lags, 0.5), "max": max(lags)}
                for group, lags in self.samples.items() if lags}


@dataclass
class Stack:
    """A namespace with its collector and analyzer processes and a tap on their output."""

    namespace: str
    state: Path
    services: list[launcher.ServiceProcess]
    tap: Tap
    trusted_keys: list[Path]
    lag: LagSampler
    report_master: bytes  # the collector's, which the simulated nodes' report keys come from

    def check(self) -> None:
        dead = launcher.dead_services(self.services)
        if dead:
            raise RuntimeError(f"service(s) died: {[s.name for s in dead]}; logs in "
                               f"{self.state / 'logs'}")
        self.tap.check()

    async def wait_ready(self, nodes: int, timeout_s: float) -> float:
        """Until the analyzer publishes a pool health with every node up; returns seconds."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            self.check()
            health = self.tap.seen.health
            if health and health[-1].nodes_by_state.get("up", 0) == nodes:
                return time.monotonic() - started
            await asyncio.sleep(0.2)
        raise TimeoutError(f"the fleet was not seen up within {timeout_s}s "
                           f"(logs in {self.state / 'logs'})")


@asynccontextmanager
async def stack(bootstrap: str, redis_url: str, label: str, nodes: Sequence[str],
                settings: dict[str, str], keep: bool, *,
                services_run: tuple[str, ...] = ("collector", "analyzer"),
                cluster: str = CLUSTER) -> AsyncIterator[Stack]:
    """Topics, keys, enrolment, then the services (`services_run`; the replay's collector
    and analyzer unless told); everything stopped on the way out."""
    namespace = f"replay{label}{uuid4().hex[:6]}"
    state = Path(tempfile.mkdtemp(prefix=f"cw-replay-{label}-"))
    env = {"KAFKA_BOOTSTRAP_SERVERS": bootstrap, "REDIS_URL": redis_url,
           "WARDEN_NAMESPACE": namespace, "WARDEN_CLUSTER_ID": cluster,
           "WARDEN_STATE_DIR": str(state), "WARDEN_LOG_LEVEL": "WARNING", **settings}
    await ensure_topics(bootstrap, namespace)
    # The signers' key pairs exist before the collector starts, so the collector signs
    # probes with its own and the simulated fleet can verify them.
    trusted = ensure_signer_keys(state / "keys")
    master = ensure_master(master_path("", state))
    await register(redis_url, namespace, cluster, nodes)
    services: list[launcher.ServiceProcess] = []
    tap = Tap(bootstrap, namespace)
    lag = LagSampler(bootstrap, namespace)
    try:
        services = launcher.start_services(state, env, services_run)
        await tap.start()
        await lag.start()
        yield Stack(namespace, state, services, tap, trusted, lag, master)
    finally:
        launcher.stop_services(services)
        await lag.stop()
        await tap.stop()
        if not keep:
            await drop_namespace(bootstrap, redis_url, namespace)


async def sleep_until(moment: float) -> None:
    """Sleep until an epoch time (returns at once if it has passed)."""
    delay = moment - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
