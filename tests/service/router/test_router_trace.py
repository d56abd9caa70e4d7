"""An ML task's routing is one trace, the submission's, on the real Redis: the record keeps
the submission's context, and what the router sends (its decisions, its commands, the
outcome), from the submission's handler, an agent's answer or the sweep, goes out in it."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from common.tracing import current_trace
from schemas.envelope import Envelope
from schemas.topics import Topic
from services.router.records import TaskRecord
from tests.service.router.conftest import Harness


@pytest.fixture
def tracer() -> Iterator[trace.Tracer]:
    provider = TracerProvider()
    yield provider.get_tracer("test")
    provider.shutdown()


def trace_id(packed: str) -> str:
    return packed.split("-")[1] if packed else ""


def traced(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Topic, str]]:
    """Each topic the router publishes to, with the trace it published in."""
    sent: list[tuple[Topic, str]] = []
    publish = harness.bus.publish

    async def recording(topic: Topic, event: Envelope) -> None:
        sent.append((topic, trace_id(current_trace())))
        await publish(topic, event)

    monkeypatch.setattr(harness.bus, "publish", recording)
    return sent


async def record_of(harness: Harness, task_id: UUID) -> TaskRecord:
    raw = await harness.redis.get(harness.keys.ml_task(str(task_id)))
    assert raw is not None
    return TaskRecord.model_validate_json(raw)


async def test_every_step_of_a_task_is_in_the_submissions_trace(
    harness: Harness, tracer: trace.Tracer, monkeypatch: pytest.MonkeyPatch
) -> None:
    await harness.fleet()
    sent = traced(harness, monkeypatch)
    with tracer.start_as_current_span("submitted"):
        submission = current_trace()
        task = await harness.submit()
    assert (await record_of(harness, task.task_id)).trace_context == submission
    (first,) = harness.commands(task.task_id)
    # The attempt times out; the sweep (a loop, no span of its own) retries it elsewhere.
    harness.clock.advance(harness.router.settings.attempt_timeout_s + 1)
    await harness.router.sweep()
    retry = [c for c in harness.commands(task.task_id) if c.command_id != first.command_id]
    assert retry
    # The agent's answer arrives in a trace of its own (a producer that kept none).
    with tracer.start_as_current_span("an answer of another trace"):
        await harness.answer(retry[0])
    assert harness.outcomes(task.task_id)[-1].state == "succeeded"
    topics = {topic for topic, _ in sent}
    assert {Topic.ML_DECISIONS, Topic.NODE_COMMANDS, Topic.ML_TASKS_OUTCOMES} <= topics
    assert {trace for _, trace in sent} == {trace_id(submission)}


async def test_a_task_submitted_outside_any_trace_still_routes(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    await harness.fleet()
    sent = traced(harness, monkeypatch)
    task = await harness.submit()
    assert (await record_of(harness, task.task_id)).trace_context == ""
    assert harness.commands(task.task_id)
    assert sent
