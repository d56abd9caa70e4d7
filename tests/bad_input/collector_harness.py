"""The collector's report handler in this process, on the real redis-server: what it
dead-letters, publishes, counts and keeps of each batch of raw records (no broker between).

The handler is the production one (`Collector.on_reports`, with its NodeStore scripts and
its ReportAuthenticator); only the publishers are recorders, so a test sees every dead letter
and every sample or alert without a consumer on a topic.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from redis.asyncio import Redis

from common.deadletter import DeadLetterPolicy
from common.messaging import BulkPublisher
from common.reportauth import ReportAuthenticator, enrol_key
from schemas.envelope import Envelope
from schemas.events.v1 import Alert, NodeReport, SampleBatch
from schemas.topics import Topic
from services.collector.handlers import Collector
from services.collector.settings import CollectorSettings
from services.collector.store import NodeStore
from services.shared.redis_client import Keys, text
from services.shared.registry import register_nodes, registered_nodes
from tests.service.router.test_registry_batch import Headers, consumed

CLUSTER = "itest"


class RecordingBulk(BulkPublisher):
    """Keeps what the collector publishes (samples, state changes, alerts), in order."""

    def __init__(self) -> None:  # no producer: nothing leaves the process
        self.published: list[tuple[Topic, Envelope]] = []
        # Each event's own headers (its trace, its samples' traces), in the same order.
        self.headers: list[Mapping[str, str]] = []

    async def publish_many(self, topic: Topic, events: Sequence[Envelope],
                           headers: Sequence[Mapping[str, str]] | None = None) -> int:
        self.published += [(topic, event) for event in events]
        self.headers += list(headers) if headers else [{} for _ in events]
        return len(events)


@dataclass(frozen=True)
class DeadLetter:
    key: bytes | None
    value: bytes
    reason: str
    offset: int


@dataclass
class CollectorHarness:
    """A collector over one Redis namespace whose enrolled nodes hold keys of `master`."""

    collector: Collector
    redis: Redis
    keys: Keys
    master: bytes
    bus: RecordingBulk
    metrics: InMemoryMetricReader
    letters: list[DeadLetter] = field(default_factory=list)

    def sign(self, report: NodeReport, as_node: str | None = None) -> tuple[bytes, bytes,
                                                                          Headers]:
        """The record an agent publishes: key, bytes and the MAC of `as_node`'s key (by
        default the report's own node)."""
        key = enrol_key(self.master, report.cluster_id, as_node or report.node_id)
        body = report.model_dump_json().encode()
        return (report.node_id.encode(), body,
                tuple((k, v.encode()) for k, v in key.headers(body).items()))

    async def feed(self, *records: tuple[bytes | None, bytes] | tuple[bytes | None, bytes,
                                                                        Headers]) -> None:
        """One batch of raw records, as the reports subscriber hands it over."""
        await self.collector.on_reports([], consumed(*records))

    def reasons(self) -> list[str]:
        return [letter.reason for letter in self.letters]

    def samples(self) -> list[tuple[str, str]]:
        """(sample event id, report event id) of every sample published, in order."""
        return [(str(s.event_id), str(s.report_event_id))
                for topic, batch in self.bus.published
                if topic == Topic.OPS_SAMPLES and isinstance(batch, SampleBatch)
                for s in batch.samples]

    def alerts(self) -> list[Alert]:
        return [a for topic, a in self.bus.published
                if topic == Topic.OPS_ALERTS and isinstance(a, Alert)]

    def state_changes(self) -> list[Envelope]:
        return [e for topic, e in self.bus.published if topic == Topic.OPS_NODE_STATE]

    async def node(self, node: str) -> dict[str, str]:
        """The collector's Redis hash of a node ({} for a node it never applied)."""
        raw = await self.redis.hgetall(self.keys.node(CLUSTER, node))
        return {text(k): text(v) for k, v in raw.items()}

    async def enrolled(self) -> list[str]:
        return await registered_nodes(self.redis, self.keys, CLUSTER)

    def counted(self) -> Counter[str]:
        """The `warden.collector.reports` counter by outcome (cumulative since the bench began)."""
        counts: Counter[str] = Counter()
        data = self.metrics.get_metrics_data()
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != "warden.collector.reports":
                        continue
                    for point in metric.data.data_points:
                        outcome = str((point.attributes or {})["outcome"])
                        counts[outcome] += int(getattr(point, "value", 0))
        return counts


async def collector_harness(redis: Redis, keys: Keys, enrolled: Sequence[str]) -> CollectorHarness:
    """A collector whose cluster itest enrols `enrolled`; MACs required, as deployed."""
    await register_nodes(redis, keys, CLUSTER, enrolled)
    master = secrets.token_bytes(32)
    reader = InMemoryMetricReader()
    bus = RecordingBulk()
    letters: list[DeadLetter] = []

    async def publish(topic: str, key: bytes | None, value: bytes,
                      headers: dict[str, str]) -> None:
        letters.append(DeadLetter(key, value, headers["dlt-reason"],
                                  int(headers["dlt-original-offset"])))

    collector = Collector(
        CollectorSettings(require_report_mac=True), NodeStore(redis, keys), bus,
        DeadLetterPolicy("bad-input.collector", publish), trace.get_tracer("bad-input"),
        MeterProvider(metric_readers=[reader]).get_meter("clusterwarden.collector"),
        authenticator=ReportAuthenticator([master]))
    return CollectorHarness(collector, redis, keys, master, bus, reader, letters)
