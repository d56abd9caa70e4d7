"""B10: a report too large for the broker, at the agent that publishes it.

The schema's bounds (64 GPUs, 256 faults, 1,024 jobs, 256-character texts) admit a report of
over 1 MiB, which the producer refuses (aiokafka's max_request_size, the broker's
message.max.bytes). The agent's report loop must log the failed publish and keep its
heartbeat going; nothing of the refused report reaches the topic, so no collector sees it.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path

import pytest

from agent.app import create_agent
from agent.faults import FaultPlan
from agent.settings import AgentSettings
from common.messaging import delete_topics, ensure_topics
from schemas.events.v1 import Fault, GpuMetrics, JobInfo, NodeReport
from schemas.topics import Topic
from tests.integration.harness import Record, name, tap

NODE = "node-010"
PRODUCER_LIMIT = 1_048_576  # aiokafka's default max_request_size, the broker's order too


def too_large(report: NodeReport) -> NodeReport:
    """`report` filled to the schema's bounds: valid, and over a MiB as JSON (a control
    character is 6 bytes there: \\u0001)."""
    gpu = report.gpus[0].model_dump() | {"uuid": "\x01" * 256, "name": "\x01" * 256,
                                         "xid_events": [79] * 64}
    data = report.model_dump() | {
        "gpus": [GpuMetrics.model_validate(gpu | {"index": i}).model_dump() for i in range(64)],
        "faults": [Fault(kind="agent", detail="\x01" * 256).model_dump()] * 256,
        "jobs": [JobInfo(job_id=f"j{i:0127d}", kind="training", state="running",
                         gpu_indices=list(range(64))).model_dump() for i in range(1024)],
    }
    large = NodeReport.model_validate(data)
    assert len(large.model_dump_json()) > PRODUCER_LIMIT
    return large


async def test_a_report_too_large_to_publish_is_logged_and_the_heartbeat_goes_on_B10(
        kafka_bootstrap: str, namespace: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    settings = AgentSettings(node_id=NODE, namespace=namespace, cluster_id="itest",
                             state_dir=str(tmp_path / "state"), interval_s=0.2, jobs="sim",
                             kafka_bootstrap_servers=kafka_bootstrap, peer_probes=0)
    await ensure_topics(kafka_bootstrap, namespace)
    agent = create_agent(settings)
    refused: list[NodeReport] = []
    try:
        await agent.open_local()
        reporter = agent._reporter
        assert reporter is not None
        build = reporter.build
        built: list[NodeReport] = []

        def second_report_too_large(now: datetime, plan: FaultPlan) -> NodeReport:
            """The agent's own reports, but the second one filled to the schema's bounds."""
            report = build(now, plan)
            if len(built) == 1:
                report = too_large(report)
                refused.append(report)
            built.append(report)
            return report

        monkeypatch.setattr(reporter, "build", second_report_too_large)
        await agent.broker.connect()
        async with tap(kafka_bootstrap, name(Topic.NODE_REPORTS, namespace)) as reports:
            with caplog.at_level(logging.ERROR, logger="clusterwarden.agent"):
                await agent.start_reporting()

                def after_the_refused_one(record: Record) -> bool:
                    return len(built) > 3 and str(built[3].event_id).encode() in record.value

                await reports.wait_for(after_the_refused_one, 60,
                                       "a report two heartbeats after the refused one")
                await reports.catch_up()
            loop = agent._loop_task
            assert loop is not None
            assert not loop.done()  # the heartbeat goes on
    finally:
        await agent.stop_reporting()
        await agent.close()
        await agent.broker.stop()
        await delete_topics(kafka_bootstrap, namespace)
    assert len(refused) == 1
    on_topic = [NodeReport.model_validate_json(r.value).event_id for r in reports.records]
    assert refused[0].event_id not in on_topic
    assert [built[0].event_id, built[2].event_id, built[3].event_id] == on_topic[:3]
    [failure] = [r for r in caplog.records if "publishing the report failed" in r.getMessage()]
    assert failure.exc_info is not None
    assert "MessageSizeTooLarge" in type(failure.exc_info[1]).__name__
