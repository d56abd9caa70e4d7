"""Batches keep each report's trace, on the real redis-server: the collector reads reports in
batches, but each report's sample and state change go on in the report's own trace (the
samples of a batch list theirs in the `item-traces` header), and a need the analyzer raises
from a sample goes out in that sample's trace, not in the batch's."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, cast
from uuid import uuid4

import pytest
from faststream.kafka import KafkaMessage
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from redis.asyncio import Redis

from common.tracing import ITEM_TRACES_HEADER, current_trace, item_traces, item_traces_header
from schemas.envelope import Envelope
from schemas.events.v1 import OpsNeed, Sample, SampleBatch, now_utc
from schemas.topics import Topic
from services.analyzer.handlers import Analyzer
from services.analyzer.needs import enabled
from services.analyzer.settings import AnalyzerSettings
from services.analyzer.store import AnalyzerStore, PoolStore
from services.shared.redis_client import Keys
from tests.bad_input.collector_harness import collector_harness
from tests.contracts.examples import examples
from tests.integration.test_dead_letters import fresh_report

TRACE_A = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACE_B = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def trace_id(packed: str) -> str:
    return packed.split("-")[1] if packed else ""


@pytest.fixture
def tracer() -> Iterator[trace.Tracer]:
    provider = TracerProvider()
    yield provider.get_tracer("test")
    provider.shutdown()


async def test_each_reports_sample_and_state_change_stay_in_its_trace(
    redis: Redis, keys: Keys, tracer: trace.Tracer
) -> None:
    bench = await collector_harness(redis, keys, ["node-001", "node-002"])
    first, second = fresh_report("node-001"), fresh_report("node-002")
    records = []
    for report, parent in ((first, TRACE_A), (second, TRACE_B)):
        key, body, mac = bench.sign(report)
        records.append((key, body, (*mac, ("traceparent", parent.encode()))))
    # The batch's own span, as FastStream's batch consumer makes it: a trace of its own.
    with tracer.start_as_current_span("reports process"):
        batch_trace = trace_id(current_trace())
        await bench.feed(*records)
    sent = list(zip(bench.bus.published, bench.bus.headers, strict=True))
    [(_, batch)] = [(h, e) for (topic, e), h in sent if topic == Topic.OPS_SAMPLES]
    [headers] = [h for (topic, _), h in sent if topic == Topic.OPS_SAMPLES]
    assert isinstance(batch, SampleBatch)
    by_node = dict(zip((s.node_id for s in batch.samples),
                       item_traces(headers, len(batch.samples)), strict=True))
    assert {node: trace_id(t) for node, t in by_node.items()} == {
        "node-001": trace_id(TRACE_A), "node-002": trace_id(TRACE_B)}
    # A first report is a state change: each goes out as a message of its report's trace.
    changes = {e.subject: trace_id(h["traceparent"]) for (topic, e), h in sent
               if topic == Topic.OPS_NODE_STATE}
    assert changes == {"node-001": trace_id(TRACE_A), "node-002": trace_id(TRACE_B)}
    assert batch_trace not in changes.values()


class TracingBus:
    """Keeps each need published with the trace it went out in (or refuses it: `down`)."""

    def __init__(self, down: bool = False) -> None:
        self.sent: list[tuple[Envelope, str]] = []
        self.down = down

    async def publish_many(self, topic: Topic, events: Sequence[Envelope]) -> int:
        if self.down:
            raise ConnectionError("Kafka is down")
        self.sent += [(event, current_trace()) for event in events]
        return len(events)


def faulty(seq: int) -> Sample:
    """A sample of node-002 with a fatal XID (two in a row take a node offline)."""
    sample = examples()["sample_batch"]
    assert isinstance(sample, SampleBatch)
    return sample.samples[0].model_copy(update={
        "event_id": uuid4(), "report_event_id": uuid4(), "seq": seq, "node_id": "node-002",
        "subject": "node-002", "cluster_id": "itest"})


async def test_a_need_goes_out_in_the_trace_of_the_sample_that_raised_it(
    redis: Redis, keys: Keys, tracer: trace.Tracer
) -> None:
    bus = TracingBus()
    analyzer = Analyzer(AnalyzerSettings(), enabled(["offline"]), AnalyzerStore(redis, keys),
                        PoolStore(redis, keys), cast(Any, bus), keys)
    samples = [faulty(1), faulty(2)]
    batch = examples()["sample_batch"].model_copy(update={"samples": samples})
    assert isinstance(batch, SampleBatch)
    message = cast(KafkaMessage, SimpleNamespace(
        headers=item_traces_header([TRACE_A, TRACE_B])))
    with tracer.start_as_current_span("samples process"):
        await analyzer.on_samples(batch, message)
    [(need, packed)] = bus.sent
    assert isinstance(need, OpsNeed)
    # The second faulty sample in a row raised it: its report's trace, not the first's.
    assert need.evidence[0].source_event_id == samples[1].report_event_id
    assert trace_id(packed) == trace_id(TRACE_B)


async def test_a_need_left_in_the_outbox_is_relayed_in_its_samples_trace(
    redis: Redis, keys: Keys, tracer: trace.Tracer
) -> None:
    """The broker refused it (or the analyzer died before publishing): the relay, a loop
    with no span, publishes it in the trace of the sample that raised it."""
    down = TracingBus(down=True)
    analyzer = Analyzer(AnalyzerSettings(), enabled(["offline"]), AnalyzerStore(redis, keys),
                        PoolStore(redis, keys), cast(Any, down), keys)
    batch = examples()["sample_batch"].model_copy(update={"samples": [faulty(1), faulty(2)]})
    assert isinstance(batch, SampleBatch)
    message = cast(KafkaMessage, SimpleNamespace(
        headers=item_traces_header([TRACE_A, TRACE_B])))
    with tracer.start_as_current_span("samples process"), \
            pytest.raises(ConnectionError):
        await analyzer.on_samples(batch, message)
    relayed = TracingBus()
    assert await analyzer.store.outbox.relay(relayed, now_utc() + timedelta(minutes=5),
                                             30.0) == 1
    [(need, packed)] = relayed.sent
    assert isinstance(need, OpsNeed)
    assert trace_id(packed) == trace_id(TRACE_B)


async def test_samples_from_an_older_collector_stay_in_the_batchs_trace(
    redis: Redis, keys: Keys, tracer: trace.Tracer
) -> None:
    bus = TracingBus()
    analyzer = Analyzer(AnalyzerSettings(), enabled(["offline"]), AnalyzerStore(redis, keys),
                        PoolStore(redis, keys), cast(Any, bus), keys)
    batch = examples()["sample_batch"].model_copy(update={"samples": [faulty(1), faulty(2)]})
    assert isinstance(batch, SampleBatch)
    message = cast(KafkaMessage, SimpleNamespace(headers={ITEM_TRACES_HEADER: "[]"}))
    with tracer.start_as_current_span("samples process"):
        batch_trace = trace_id(current_trace())
        await analyzer.on_samples(batch, message)
    [(_, packed)] = bus.sent
    assert trace_id(packed) == batch_trace
