"""The trace context kept beside what waits, and the spans that pick it up again
(common/tracing.py), on an in-memory tracer: which span is whose parent, and what is linked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from common.tracing import (
    ITEM_TRACES_HEADER,
    context_of,
    current_trace,
    headers_trace,
    item_span,
    item_traces,
    item_traces_header,
    need_attributes,
    pack,
    resumed_context,
    resumed_span,
    span_trace,
    task_attributes,
    unpack,
)
from schemas.events.v1 import OpsNeed, OpsTask
from tests.contracts.examples import examples

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer(spans: InMemorySpanExporter) -> Iterator[trace.Tracer]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    yield provider.get_tracer("test")
    provider.shutdown()


def finished(spans: InMemorySpanExporter, name: str) -> ReadableSpan:
    (span,) = [s for s in spans.get_finished_spans() if s.name == name]
    return span


def ids(span: trace.Span | ReadableSpan | trace.Link) -> tuple[int, int]:
    context = span.context if isinstance(span, trace.Link) else span.get_span_context()
    assert context is not None
    return context.trace_id, context.span_id


def test_a_packed_context_is_the_traceparent_then_the_tracestate() -> None:
    assert pack({"traceparent": PARENT}) == PARENT
    both = {"traceparent": PARENT, "tracestate": "vendor=a b, other=c"}
    assert pack(both) == f"{PARENT} vendor=a b, other=c"
    assert unpack(pack(both)) == both  # a tracestate may hold spaces; a traceparent never
    assert unpack(PARENT) == {"traceparent": PARENT}
    assert pack({}) == ""
    assert pack({"tracestate": "a=b"}) == ""  # a state without a parent names nothing
    assert unpack("") == {}


def test_no_span_is_no_context_and_garbage_names_no_parent() -> None:
    assert current_trace() == ""
    assert not trace.get_current_span(context_of("not a traceparent")).get_span_context(
    ).is_valid
    assert not trace.get_current_span(context_of("")).get_span_context().is_valid


def test_the_current_span_packs_and_its_context_comes_back(tracer: trace.Tracer) -> None:
    with tracer.start_as_current_span("writer") as span:
        packed = current_trace()
        assert packed == span_trace(span)
    trace_id, span_id = ids(span)
    # Sampled (and, from SDKs that say so, with a random trace id: flags 03).
    assert packed in (f"00-{trace_id:032x}-{span_id:016x}-01",
                      f"00-{trace_id:032x}-{span_id:016x}-03")
    restored = trace.get_current_span(context_of(packed)).get_span_context()
    assert (restored.trace_id, restored.span_id, restored.is_remote) == (trace_id, span_id, True)


def test_a_loop_resumes_the_stored_trace(tracer: trace.Tracer,
                                         spans: InMemorySpanExporter) -> None:
    with resumed_span(tracer, "dispatch", PARENT, attributes={"task.id": "t1"}):
        pass
    span = finished(spans, "dispatch")
    assert span.parent is not None
    assert (f"{span.context.trace_id:032x}", f"{span.parent.span_id:016x}") == (
        "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    assert span.links == ()  # no loop span to link
    assert span.attributes == {"task.id": "t1"}


def test_a_handler_of_the_same_trace_is_the_parent(tracer: trace.Tracer,
                                                   spans: InMemorySpanExporter) -> None:
    """The answer to a step's command arrives in the step's trace: the next span is the
    handler's child, in the order things happened."""
    with tracer.start_as_current_span("task") as task:
        stored = current_trace()
        with tracer.start_as_current_span("handler") as handler, \
                resumed_span(tracer, "step", stored):
            pass
    step = finished(spans, "step")
    assert step.parent is not None
    assert (step.context.trace_id, step.parent.span_id) == ids(handler)
    assert ids(task)[0] == step.context.trace_id
    assert step.links == ()


def test_another_trace_is_linked_and_the_stored_one_continued(
    tracer: trace.Tracer, spans: InMemorySpanExporter
) -> None:
    """An operator's control (a trace of its own) moves a task on: the step stays in the
    task's trace, linked to the control's span."""
    with tracer.start_as_current_span("control") as control, \
            resumed_span(tracer, "step", PARENT):
        pass
    step = finished(spans, "step")
    assert f"{step.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert [ids(link) for link in (step.links or ())] == [ids(control)]


def test_nothing_stored_is_a_child_of_the_current_span(tracer: trace.Tracer,
                                                       spans: InMemorySpanExporter) -> None:
    with tracer.start_as_current_span("sweep") as sweep, resumed_span(tracer, "old", ""):
        pass
    old = finished(spans, "old")
    assert old.parent is not None
    assert (old.context.trace_id, old.parent.span_id) == ids(sweep)


def test_a_resumed_context_has_no_span_of_its_own(tracer: trace.Tracer,
                                                  spans: InMemorySpanExporter) -> None:
    with resumed_context(PARENT):
        assert current_trace() == PARENT
        with tracer.start_as_current_span("publish"):
            pass
    assert current_trace() == ""
    assert [s.name for s in spans.get_finished_spans()] == ["publish"]
    with resumed_context("garbage"):
        assert current_trace() == ""


def test_each_item_of_a_batch_continues_its_own_trace(tracer: trace.Tracer,
                                                      spans: InMemorySpanExporter) -> None:
    with tracer.start_as_current_span("batch") as batch:
        own = item_span(tracer, "item", PARENT)
        bare = item_span(tracer, "bare", "")
    own.end()
    bare.end()
    item = finished(spans, "item")
    assert f"{item.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert [ids(link) for link in (item.links or ())] == [ids(batch)]
    # An item that came without a context belongs to the batch.
    orphan = finished(spans, "bare")
    assert orphan.parent is not None
    assert (orphan.context.trace_id, orphan.parent.span_id) == ids(batch)


def test_a_batch_header_lists_each_items_context_in_order() -> None:
    header = item_traces_header([PARENT, "", f"{PARENT} a=b"])
    assert item_traces(header, 3) == [PARENT, "", f"{PARENT} a=b"]
    # As a consumer gets it: decoded to text (FastStream), or the raw bytes.
    raw = {ITEM_TRACES_HEADER: header[ITEM_TRACES_HEADER].encode()}
    assert item_traces(raw, 3) == [PARENT, "", f"{PARENT} a=b"]
    assert item_traces_header(["", ""]) == {}  # nothing to carry: no header


@pytest.mark.parametrize("headers", [
    None, {}, {ITEM_TRACES_HEADER: "not json"}, {ITEM_TRACES_HEADER: '["only one"]'},
    {ITEM_TRACES_HEADER: "[1, 2]"}, {ITEM_TRACES_HEADER: '{"a": 1}'},
])
def test_a_missing_or_wrong_batch_header_leaves_every_item_to_the_message(
    headers: dict[str, str] | None
) -> None:
    assert item_traces(headers, 2) == ["", ""]


def test_a_records_headers_give_its_context() -> None:
    record = [("content-type", b"application/json"), ("traceparent", PARENT.encode()),
              ("tracestate", b"a=b")]
    assert headers_trace(record) == f"{PARENT} a=b"
    assert headers_trace({"traceparent": PARENT}) == PARENT
    assert headers_trace([("event-type", b"node_report")]) == ""
    assert headers_trace(None) == ""


def test_the_attributes_name_the_need_the_task_and_where_they_act() -> None:
    need = examples()["ops_need"]
    assert isinstance(need, OpsNeed)
    attributes = need_attributes(need)
    assert attributes["need.id"] == str(need.event_id)
    assert attributes["cluster.id"] == need.cluster_id
    assert attributes["node.id"] == need.target
    assert "node.id" not in need_attributes(need.model_copy(update={"level": "cluster"}))
    task = examples()["ops_task"]
    assert isinstance(task, OpsTask)
    named = task_attributes(task)
    assert {k: named[k] for k in ("task.id", "need.id", "task.target", "cluster.id")} == {
        "task.id": str(task.task_id), "need.id": str(task.need_id),
        "task.target": task.target, "cluster.id": task.cluster_id}
