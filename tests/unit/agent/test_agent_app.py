"""The agent's wiring, on FastStream's in-memory broker (no Kafka, no network)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from faststream.kafka import KafkaBroker, KafkaMessage, TestKafkaBroker

from agent.app import Agent, create_agent, create_app
from agent.faults import FaultPlan, write_faults
from agent.settings import AgentSettings
from schemas.envelope import Envelope
from schemas.events.v1 import (
    CommandResult,
    DrainNode,
    NodeReport,
    QueryStatus,
    now_utc,
)
from schemas.topics import Topic, topic_name

NODE = "node-001"
E = TypeVar("E", bound=Envelope)


@pytest.fixture
def settings(tmp_path: Path, centre: Any) -> AgentSettings:
    return AgentSettings(
        node_id=NODE,
        namespace=f"test-{tmp_path.name[-20:].replace('_', '-')}",
        cluster_id="local",
        state_dir=str(tmp_path / "state"),
        trusted_keys=[centre.public_key],
        interval_s=0.05,
    )


class Sink:
    """Everything published on one topic, as (headers, body)."""

    def __init__(self) -> None:
        self.messages: list[tuple[dict[str, Any], bytes]] = []
        self.arrived = asyncio.Condition()

    def parsed(self, model: type[E]) -> list[E]:
        return [model.model_validate_json(body) for _, body in self.messages]

    def subscribe(self, broker: KafkaBroker, topic: str) -> None:
        # The raw bytes, not FastStream's JSON-decoded body: the test parses them strictly.
        async def receive(body: Any, msg: KafkaMessage) -> None:
            self.messages.append((dict(msg.headers), msg.body))
            async with self.arrived:
                self.arrived.notify_all()

        broker.subscriber(topic)(receive)


@pytest.fixture
async def running(settings: AgentSettings) -> AsyncIterator[tuple[Agent, dict[Topic, Sink]]]:
    agent = create_agent(settings)
    sinks = {Topic.NODE_REPORTS: Sink(), Topic.NODE_COMMAND_RESULTS: Sink()}
    for topic, sink in sinks.items():
        sink.subscribe(agent.broker, topic_name(topic, settings.namespace))
    agent.open()
    try:
        async with TestKafkaBroker(agent.broker):
            yield agent, sinks
    finally:
        await agent.stop_reporting()
        await agent.close()


async def test_command_in_result_out(
    running: tuple[Agent, dict[Topic, Sink]], centre: Any, settings: AgentSettings
) -> None:
    agent, sinks = running
    command = centre.command(DrainNode(node_id=NODE), issued_at=now_utc())
    await agent.broker.publish(
        command.model_dump_json().encode(),
        topic=topic_name(Topic.NODE_COMMANDS, settings.namespace),
        key=NODE.encode(),
    )
    results = sinks[Topic.NODE_COMMAND_RESULTS].parsed(CommandResult)
    assert [(r.action, r.outcome) for r in results] == [("drain_node", "succeeded")]

    # A command for another node on the shared topic gets no answer at all.
    other = centre.command(DrainNode(node_id="node-002"), node="node-002", issued_at=now_utc())
    await agent.broker.publish(
        other.model_dump_json().encode(),
        topic=topic_name(Topic.NODE_COMMANDS, settings.namespace),
        key=b"node-002",
    )
    query = centre.command(
        QueryStatus(node_id=NODE, command_id=results[0].command_id), seq=2, issued_at=now_utc()
    )
    await agent.broker.publish(
        query.model_dump_json().encode(),
        topic=topic_name(Topic.NODE_COMMANDS, settings.namespace),
        key=NODE.encode(),
    )
    results = sinks[Topic.NODE_COMMAND_RESULTS].parsed(CommandResult)
    assert [(r.action, r.outcome) for r in results] == [
        ("drain_node", "succeeded"), ("query_status", "succeeded")
    ]


async def test_report_is_traced_and_carries_the_mode(
    running: tuple[Agent, dict[Topic, Sink]]
) -> None:
    agent, sinks = running
    await agent.report_once(FaultPlan(xid=[79]))
    headers, body = sinks[Topic.NODE_REPORTS].messages[-1]
    report = NodeReport.model_validate_json(body)
    assert report.node_id == NODE
    assert report.gpu_source in ("simulated", "nvml")
    assert [f.code for f in report.faults if f.kind == "xid"][-1] == 79
    # The report's span travels in the Kafka headers (W3C trace context).
    assert "traceparent" in headers


async def test_loop_reports_until_stopped_and_goes_silent(
    running: tuple[Agent, dict[Topic, Sink]]
) -> None:
    agent, sinks = running
    reports = sinks[Topic.NODE_REPORTS]
    await agent.start_reporting()
    async with asyncio.timeout(5), reports.arrived:
        await reports.arrived.wait_for(lambda: len(reports.messages) >= 3)
    write_faults(agent.state_dir, FaultPlan(silent=True))
    await asyncio.sleep(0.1)  # let a report already under way finish
    count = len(reports.messages)
    await asyncio.sleep(0.3)
    assert len(reports.messages) == count  # alive, but no heartbeat
    seqs = [NodeReport.model_validate_json(b).seq for _, b in reports.messages]
    assert seqs == sorted(set(seqs))
    async with asyncio.timeout(5):
        await agent.stop_reporting()
    assert agent._loop_task is None


def test_create_app_builds_without_connecting(settings: AgentSettings) -> None:
    app = create_app(settings)
    assert app.broker is not None
    # Nothing is opened until startup: creating the app touches no files.
    assert not Path(settings.state_dir).exists()
