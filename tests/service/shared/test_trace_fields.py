"""What waits in Redis keeps the trace it was written in, on the real redis-server: a queued
task (services/scheduler/queue.py), a workflow's journal (services/executor/journal.py) and
an outbox event (services/shared/outbox.py), each relayed or claimed in its own trace."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from redis.asyncio import Redis

from common.clock import epoch_ms
from common.tracing import current_trace
from schemas.envelope import Envelope
from schemas.events.v1 import NodeState
from schemas.topics import Topic
from services.executor.journal import Journal
from services.scheduler.queue import TaskQueue, trace_field
from services.shared.outbox import OUTBOX_LUA, Outbox, parse_record, record
from services.shared.redis_client import Keys, text
from tests.service.executor.test_journal import make_task
from tests.service.scheduler.helpers import task

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
CHANGE = OUTBOX_LUA + """
outbox_append(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
return 1
"""


@pytest.fixture
def tracer() -> Iterator[trace.Tracer]:
    provider = TracerProvider()
    yield provider.get_tracer("test")
    provider.shutdown()


def trace_id(packed: str) -> str:
    return packed.split("-")[1] if packed else ""


class TracingBus:
    """Keeps each event published with the trace it went out in."""

    def __init__(self) -> None:
        self.sent: list[tuple[Envelope, str]] = []

    async def publish_many(self, topic: Topic, events: Sequence[Envelope]) -> int:
        self.sent += [(event, current_trace()) for event in events]
        return len(events)


def went_down(node: str) -> NodeState:
    return NodeState(event_id=uuid4(), source="collector", occurred_at=T0, cluster_id="c1",
                     subject=node, node_id=node, pool="default", state="down",
                     previous="suspect", reason="silent", last_report_at=T0)


async def test_a_relayed_event_goes_out_in_the_trace_it_was_written_in(
    redis: Redis, keys: Keys, tracer: trace.Tracer
) -> None:
    outbox, bus = Outbox(redis, keys, "collector"), TracingBus()
    script = redis.register_script(CHANGE)
    written: dict[str, str] = {}
    for node in ("n1", "n2"):
        event = went_down(node)
        with tracer.start_as_current_span(f"sweep {node}"):
            written[node] = current_trace()
            await script(keys=outbox.script_keys,
                         args=[str(event.event_id), epoch_ms(T0),
                               record(Topic.OPS_NODE_STATE, event)])
    # Its writer died; the relay, a loop with no span of its own, publishes them.
    assert await outbox.relay(bus, T0 + timedelta(minutes=1), 30.0) == 2
    assert {e.subject: trace_id(t) for e, t in bus.sent} == {
        node: trace_id(packed) for node, packed in written.items()}
    assert current_trace() == ""


def test_a_record_without_a_trace_is_still_read() -> None:
    """One written before records kept their trace (or outside any span)."""
    event = went_down("n1")
    old = f"{Topic.OPS_NODE_STATE.value}\n{event.model_dump_json()}"
    read = parse_record(old)
    assert read is not None
    assert (read.topic, read.event, read.trace_context) == (Topic.OPS_NODE_STATE, event, "")
    assert record(Topic.OPS_NODE_STATE, event) == old  # no span: nothing added
    assert parse_record(record(Topic.OPS_NODE_STATE, event, "00-a-b-01")) == (
        Topic.OPS_NODE_STATE, event, "00-a-b-01")


async def test_a_queued_task_is_claimed_with_the_trace_it_was_queued_in(
    redis: Redis, keys: Keys, tracer: trace.Tracer
) -> None:
    queue = TaskQueue(redis, keys)
    queued = task("node-001")
    with tracer.start_as_current_span("on_task"):
        packed = current_trace()
        assert await queue.enqueue(queued, 1, 60.0)
    claimed = await queue.claim(epoch_ms(datetime.now(UTC)), 30_000, 10)
    assert claimed is not None
    assert (claimed.task, claimed.trace_context) == (queued, packed)
    # The field goes with the task.
    await queue.ack(str(queued.task_id))
    assert await redis.hgetall(keys.queue_items()) == {}
    # Queued outside any span: claimed without a context, not with a stale one.
    bare = task("node-002")
    assert await queue.enqueue(bare, 1, 60.0)
    assert not await redis.hexists(keys.queue_items(), trace_field(str(bare.task_id)))
    again = await queue.claim(epoch_ms(datetime.now(UTC)), 30_000, 10)
    assert again is not None
    assert again.trace_context == ""


async def test_a_workflow_keeps_the_trace_it_was_started_in(
    redis: Redis, keys: Keys, tracer: trace.Tracer
) -> None:
    journal = Journal(redis, keys)
    started = make_task()
    with tracer.start_as_current_span("executor.task"):
        packed = current_trace()
        assert (await journal.start(started, 1, 0, 0))[0] == "new"
    wf = await journal.load(str(started.task_id))
    assert wf is not None
    assert wf.trace_context == packed
    assert await journal.trace_of(str(started.task_id)) == packed
    # A newer dispatch takes the workflow over and leaves its trace as it was.
    with tracer.start_as_current_span("another dispatch"):
        assert (await journal.start(started, 2, 0, 0))[0] == "takeover"
    assert text(await redis.hget(keys.workflow(str(started.task_id)), "trace") or b"") == packed
    assert await journal.trace_of("no-such-task") == ""
