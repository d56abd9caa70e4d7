"""A task's workflow is one trace on the real Redis, whoever moves it on: the handler of its
dispatch, an agent's answer, the retry sweep (a loop, with no message) or an answer that
comes in another trace (services/executor/spans.py, common/tracing.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from redis.asyncio import Redis

from common.tracing import current_trace
from schemas.envelope import Envelope
from schemas.topics import Topic
from services.executor.settings import ExecutorSettings
from services.shared.redis_client import Keys
from tests.service.executor.test_handlers import Harness, drain_offline, make_harness


@pytest.fixture
def tracer() -> Iterator[trace.Tracer]:
    provider = TracerProvider()
    yield provider.get_tracer("test")
    provider.shutdown()


def trace_id(packed: str) -> str:
    return packed.split("-")[1] if packed else ""


@pytest.fixture
def harness(redis: Redis, keys: Keys, tmp_path: Path) -> Harness:
    return make_harness(redis, keys, tmp_path, ExecutorSettings(
        backoff_base_s=1.0, backoff_max_s=30.0))


def traced(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Topic, str]]:
    """Each topic the executor publishes to, with the trace it published in."""
    sent: list[tuple[Topic, str]] = []
    publish = harness.bus.publish

    async def recording(topic: Topic, event: Envelope) -> None:
        sent.append((topic, trace_id(current_trace())))
        await publish(topic, event)

    monkeypatch.setattr(harness.bus, "publish", recording)
    return sent


async def test_every_step_is_in_the_trace_the_task_was_dispatched_in(
    harness: Harness, tracer: trace.Tracer, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = traced(harness, monkeypatch)
    task = drain_offline()
    with tracer.start_as_current_span("dispatched"):
        dispatch = trace_id(current_trace())
        await harness.dispatch(task)
    assert (await harness.wf(task)).trace_context.split("-")[1] == dispatch
    # The drain fails; its retry is started by the sweep, a loop with no span.
    await harness.answer(harness.last_command(), "failed", "busy")
    await harness.retry_now(task)
    assert harness.last_command().action.action == "drain_node"
    # Its answer comes in another trace: the next step stays in the task's.
    with tracer.start_as_current_span("an answer of another trace"):
        await harness.answer(harness.last_command())
    assert harness.last_command().action.action == "offline_node"
    await harness.answer(harness.last_command())
    assert harness.final(task).state == "succeeded"
    commands = [t for topic, t in sent if topic == Topic.NODE_COMMANDS]
    assert len(commands) == 3
    assert {t for _, t in sent} == {dispatch}
