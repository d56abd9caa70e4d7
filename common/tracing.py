"""Trace context that outlives a handler, so one trace runs from a node's report to the last
step of the task it caused.

Between services the W3C `traceparent`/`tracestate` headers carry it (FastStream's
telemetry middleware writes and reads them). What waits in Redis instead (a queued task, a
workflow's journal, an ML task's record, an outbox event) is picked up later by a loop, or
by another process, with no message and so no context: it keeps its own, packed into one
field beside it (`current_trace` when it is written), and whoever picks it up starts its
span from that field (`resumed_span`). A message that carries many items of different
traces (the collector's sample batches) keeps each item's context in one header
(`ITEM_TRACES_HEADER`), and its consumer starts a span per item (`item_span`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

if TYPE_CHECKING:
    from schemas.events.v1 import OpsNeed, OpsTask

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# The header of a message holding many items (a SampleBatch's samples): a JSON list of each
# item's packed context, in the items' order ("" for an item without one).
ITEM_TRACES_HEADER = "item-traces"

_PROPAGATOR = TraceContextTextMapPropagator()


def pack(carrier: Mapping[str, str]) -> str:
    """W3C fields as one string: the traceparent, then a space and the tracestate if there is
    one. A traceparent never holds a space, so the first space splits them again."""
    parent = carrier.get(TRACEPARENT, "").strip()
    if not parent:
        return ""
    state = carrier.get(TRACESTATE, "").strip()
    return f"{parent} {state}" if state else parent


def unpack(packed: str) -> dict[str, str]:
    """The W3C fields of a packed context ({} for '')."""
    parent, _, state = packed.strip().partition(" ")
    if not parent:
        return {}
    return {TRACEPARENT: parent, TRACESTATE: state} if state else {TRACEPARENT: parent}


def current_trace(ctx: Context | None = None) -> str:
    """The current span's (or `ctx`'s) context, packed; '' where there is no valid span."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=ctx)
    return pack(carrier)


def span_trace(span: Span) -> str:
    """`span`'s context, packed ('' for an invalid one). Formatted here rather than through
    the propagator: the collector packs one per report, on its hot path."""
    context = span.get_span_context()
    if not context.is_valid:
        return ""
    parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    state = context.trace_state.to_header() if context.trace_state else ""
    return f"{parent} {state}" if state else parent


def context_of(packed: str) -> Context:
    """The parent context a packed field names; an empty context for '' or a malformed one."""
    fields = unpack(packed)
    return _PROPAGATOR.extract(fields) if fields else Context()


def headers_trace(headers: Iterable[tuple[str, bytes | str]] | Mapping[str, Any] | None) -> str:
    """The packed context of a Kafka record's headers ('' without a traceparent)."""
    pairs = headers.items() if isinstance(headers, Mapping) else (headers or ())
    carrier: dict[str, str] = {}
    for key, value in pairs:
        if key in (TRACEPARENT, TRACESTATE):
            carrier[key] = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return pack(carrier)


@contextmanager
def resumed_span(tracer: trace.Tracer, name: str, packed: str, *,
                 kind: SpanKind = SpanKind.INTERNAL,
                 attributes: Attributes = None) -> Iterator[Span]:
    """A current span in the trace `packed` names (kept beside an item in Redis).

    Inside a handler of that very trace (the answer to a task's own command) it is a child
    of the handler's span, the order things happened in. Anywhere else (a loop, a batch,
    a message of another trace) it is a child of the stored context, linked to the span it
    was started under, so the loop that picked the item up can still be found. Without a
    stored context it is simply a child of the current span.
    """
    current = trace.get_current_span().get_span_context()
    restored = context_of(packed)
    stored = trace.get_current_span(restored).get_span_context()
    parent: Context | None = None
    links: list[Link] = []
    if stored.is_valid and not (current.is_valid and current.trace_id == stored.trace_id):
        parent = restored
        if current.is_valid:
            links.append(Link(current))
    with tracer.start_as_current_span(name, context=parent, kind=kind, attributes=attributes,
                                      links=links) as span:
        yield span


@contextmanager
def resumed_context(packed: str) -> Iterator[None]:
    """The trace `packed` names made current without a span of its own: what is published
    meanwhile joins that trace, and nothing else is recorded (work that is retried every
    tick, like a held-back task's limits, would otherwise bury the trace in spans)."""
    restored = context_of(packed)
    if not trace.get_current_span(restored).get_span_context().is_valid:
        yield
        return
    token = otel_context.attach(restored)
    try:
        yield
    finally:
        otel_context.detach(token)


def item_span(tracer: trace.Tracer, name: str, packed: str, *,
              kind: SpanKind = SpanKind.INTERNAL, attributes: Attributes = None) -> Span:
    """A span (not made current; the caller ends it) for one item of a batch, continuing the
    item's own trace and linked to the batch's span; a child of the batch's span for an
    item that came without a context."""
    restored = context_of(packed)
    if not trace.get_current_span(restored).get_span_context().is_valid:
        return tracer.start_span(name, kind=kind, attributes=attributes)
    current = trace.get_current_span().get_span_context()
    links = [Link(current)] if current.is_valid else []
    return tracer.start_span(name, context=restored, kind=kind, attributes=attributes,
                             links=links)


def item_traces_header(traces: Sequence[str]) -> dict[str, str]:
    """The header that carries each item's packed context ({} when no item has one)."""
    if not any(traces):
        return {}
    return {ITEM_TRACES_HEADER: json.dumps(list(traces), separators=(",", ":"))}


def item_traces(headers: Mapping[str, Any] | None, count: int) -> list[str]:
    """Each of `count` items' packed context from a message's headers; '' for every item
    when the header is missing, malformed, or lists another number of items (a message from
    an older producer, or a hand-made one: its items then belong to the message's trace)."""
    raw = (headers or {}).get(ITEM_TRACES_HEADER)
    if isinstance(raw, bytes):
        raw = raw.decode("latin-1")
    try:
        traces = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        traces = None
    if (not isinstance(traces, list) or len(traces) != count
            or not all(isinstance(t, str) for t in traces)):
        return [""] * count
    return [str(t) for t in traces]


# ---------------------------------------------------------------- what the spans say

def need_attributes(need: OpsNeed) -> dict[str, str]:
    """A need's span attributes (the node only for a need about a node or its GPUs)."""
    attributes = {"need.id": str(need.event_id), "need.kind": need.kind,
                  "need.level": need.level, "cluster.id": need.cluster_id, "pool": need.pool}
    if need.level != "cluster":
        attributes["node.id"] = need.target
    return attributes


def task_attributes(task: OpsTask) -> dict[str, str]:
    """A task's span attributes: the task, the need it came from, where it acts."""
    attributes = {"task.id": str(task.task_id), "task.kind": task.kind,
                  "task.template": task.template, "task.target": task.target,
                  "need.id": str(task.need_id), "need.kind": task.need_kind,
                  "cluster.id": task.cluster_id, "pool": task.pool}
    if task.parent_task_id is not None:
        attributes["task.parent_id"] = str(task.parent_task_id)
    return attributes
