"""The agent's wiring, on FastStream's in-memory broker (no Kafka, no network)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
from faststream.kafka import KafkaBroker, KafkaMessage, TestKafkaBroker

from agent import app as agent_app
from agent.app import Agent, create_agent, create_app, make_jobs
from agent.faults import FaultPlan, reports_paused, write_faults
from agent.jobs import JobManager, SimulatedJobs, job_dir
from agent.ml.runtime import CHECKPOINT_FILE
from agent.peers import PROBE_FILE, EchoListener, probe_peer, read_probe_addr
from agent.settings import AgentSettings
from agent.store import META_FILE, checkpoint_dir
from schemas.envelope import Envelope
from schemas.events.v1 import (
    Action,
    CommandResult,
    DrainNode,
    MigrateJob,
    NodeReport,
    OfflineNode,
    ProbeNode,
    QueryStatus,
    SetReportInterval,
    StartJob,
    now_utc,
)
from schemas.topics import Topic, topic_name
from tests.waiting import DEADLINE_S, eventually

NODE = "node-001"
E = TypeVar("E", bound=Envelope)


@pytest.fixture
def settings(tmp_path: Path, centre: Any) -> AgentSettings:
    return AgentSettings(
        node_id=NODE,
        namespace=f"test-{tmp_path.name[-20:].replace('_', '-')}",
        cluster_id="local",
        state_dir=str(tmp_path / "state"),
        trusted_keys=centre.public_keys,
        interval_s=0.05,
        jobs="sim",  # no processes: these tests are about the wiring
        # A probe of a live peer returns as soon as it answers; this only bounds a stuck one.
        probe_timeout_s=10.0,
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


class LoopWatch:
    """The report loop seen from inside, so a test waits for what the loop did, not for time.

    `ticks`: every regular tick's decision (True: the fault plan keeps it silent), with how
    many reports the sink held at that moment. `checks`: every check for an urgent report
    while the loop waits out its interval (one at least every URGENT_POLL_S), with its answer
    and the sink's count. A tick publishes its report before the loop waits again, so the
    count seen at a check includes the reports of every tick before it.
    """

    def __init__(self, agent: Agent, sink: Sink, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ticks: list[tuple[bool, int]] = []
        self.checks: list[tuple[bool, int]] = []
        urgent = agent._urgent

        def decide(plan: FaultPlan, now: datetime) -> bool:
            silent = reports_paused(plan, now)
            self.ticks.append((silent, len(sink.messages)))
            return silent

        def check() -> bool:
            due = urgent()
            self.checks.append((due, len(sink.messages)))
            return due

        monkeypatch.setattr(agent_app, "reports_paused", decide)
        monkeypatch.setattr(agent, "_urgent", check)

    async def next_ticks(self, count: int) -> list[tuple[bool, int]]:
        start = len(self.ticks)
        await eventually(lambda: len(self.ticks) >= start + count,
                         f"{count} more ticks of the report loop")
        return self.ticks[start:start + count]

    async def next_checks(self, count: int) -> list[tuple[bool, int]]:
        start = len(self.checks)
        await eventually(lambda: len(self.checks) >= start + count,
                         f"{count} more waits of the report loop")
        return self.checks[start:start + count]


@pytest.fixture
async def running(settings: AgentSettings) -> AsyncIterator[tuple[Agent, dict[Topic, Sink]]]:
    agent = create_agent(settings)
    sinks = {Topic.NODE_REPORTS: Sink(), Topic.NODE_COMMAND_RESULTS: Sink()}
    for topic, sink in sinks.items():
        sink.subscribe(agent.broker, topic_name(topic, settings.namespace))
    await agent.open_local()
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
    running: tuple[Agent, dict[Topic, Sink]], monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, sinks = running
    reports = sinks[Topic.NODE_REPORTS]
    watch = LoopWatch(agent, reports, monkeypatch)
    await agent.start_reporting()
    await wait_reports(reports, 3)
    write_faults(agent.state_dir, FaultPlan(silent=True))
    # A tick already under way may still report; every tick that reads the plan is silent.
    await eventually(lambda: watch.ticks[-1][0], "a tick that sees the silent plan")
    count = watch.ticks[-1][1]
    later = await watch.next_ticks(4)  # alive (it keeps ticking), but no heartbeat
    assert later == [(True, count)] * 4
    assert len(reports.messages) == count
    seqs = [NodeReport.model_validate_json(b).seq for _, b in reports.messages]
    assert seqs == sorted(set(seqs))
    async with asyncio.timeout(DEADLINE_S):
        await agent.stop_reporting()
    assert agent._loop_task is None


def test_create_app_builds_without_connecting(settings: AgentSettings) -> None:
    app = create_app(settings)
    assert app.broker is not None
    # Nothing is opened until startup: creating the app touches no files.
    assert not Path(settings.state_dir).exists()


async def send(agent: Agent, centre: Any, action: Action, seq: int) -> None:
    command = centre.command(action, seq=seq, issued_at=now_utc())
    await agent.broker.publish(
        command.model_dump_json().encode(),
        topic=topic_name(Topic.NODE_COMMANDS, agent.settings.namespace),
        key=NODE.encode(),
    )


async def wait_reports(
    sink: Sink, count: int, timeout_s: float = DEADLINE_S
) -> list[NodeReport]:
    async with asyncio.timeout(timeout_s), sink.arrived:
        await sink.arrived.wait_for(lambda: len(sink.messages) >= count)
    return sink.parsed(NodeReport)


async def wait_last_report(
    sink: Sink, check: Callable[[NodeReport], bool], timeout_s: float = DEADLINE_S
) -> NodeReport:
    # A helper, not inline: FastStream's test broker cannot parse `async with` blocks inside
    # its own `async with` whose items are not calls.
    async with asyncio.timeout(timeout_s), sink.arrived:
        await sink.arrived.wait_for(
            lambda: bool(sink.messages) and check(sink.parsed(NodeReport)[-1])
        )
    return sink.parsed(NodeReport)[-1]


async def test_interval_and_probe_commands_drive_the_loop(
    running: tuple[Agent, dict[Topic, Sink]], centre: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, sinks = running
    reports = sinks[Topic.NODE_REPORTS]
    watch = LoopWatch(agent, reports, monkeypatch)
    await agent.start_reporting()
    await wait_reports(reports, 2)
    assert {r.interval_s for r in reports.parsed(NodeReport)} == {0.05}

    # Night: one report an hour. The loop now waits, and nothing arrives.
    await send(agent, centre, SetReportInterval(node_id=NODE, interval_s=3_600.0), seq=1)
    assert agent.interval_s == 3_600.0
    # A report under way when the command came may still land before the loop waits again;
    # from then on it waits (woken every URGENT_POLL_S to look for faults) and reports nothing.
    waits = await watch.next_checks(3)
    before = waits[0][1]
    assert waits == [(False, before)] * 3
    assert len(reports.messages) == before

    # Day again: the loop wakes at once rather than after the hour it was waiting out.
    await send(agent, centre, SetReportInterval(node_id=NODE, interval_s=0.5), seq=2)
    arrived = await wait_reports(reports, before + 2)
    assert arrived[-1].interval_s == 0.5
    # The new interval is in force: the loop waits about 0.5 s between reports, not 0.05 s
    # (a loaded machine only makes the gap longer; the margin is for a late first report).
    gap = (arrived[-1].occurred_at - arrived[-2].occurred_at).total_seconds()
    assert gap >= 0.25

    await send(agent, centre, ProbeNode(node_id=NODE), seq=3)
    results = sinks[Topic.NODE_COMMAND_RESULTS].parsed(CommandResult)
    assert [(r.action, r.outcome) for r in results] == [
        ("set_report_interval", "succeeded"),
        ("set_report_interval", "succeeded"),
        ("probe_node", "succeeded"),
    ]
    assert results[-1].outputs == {"mode": "active", "interval_s": 0.5}


async def test_a_new_xid_is_reported_at_once_not_at_the_next_interval(
    running: tuple[Agent, dict[Topic, Sink]], centre: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, sinks = running
    reports = sinks[Topic.NODE_REPORTS]
    watch = LoopWatch(agent, reports, monkeypatch)
    await agent.start_reporting()
    await wait_reports(reports, 1)
    # A long interval: without the urgent report, the fault would wait an hour.
    await send(agent, centre, SetReportInterval(node_id=NODE, interval_s=3_600.0), seq=1)
    # Once the loop waits out the hour, no regular report comes (a report under way may land).
    before = (await watch.next_checks(1))[0][1]
    write_faults(agent.state_dir, FaultPlan(xid=[79]))
    arrived = await wait_reports(reports, before + 1)  # long before the hour is up
    assert [f.code for f in arrived[-1].faults if f.kind == "xid"] == [79]
    assert [due for due, _ in watch.checks].count(True) == 1
    # Once: the fault is now known to the centre, and the loop waits out the hour again.
    assert await watch.next_checks(3) == [(False, before + 1)] * 3
    assert len(reports.messages) == before + 1


async def test_a_deaf_node_answers_nothing(
    running: tuple[Agent, dict[Topic, Sink]], centre: Any
) -> None:
    agent, sinks = running
    write_faults(agent.state_dir, FaultPlan(ignore_commands=True))
    await send(agent, centre, ProbeNode(node_id=NODE), seq=1)
    assert sinks[Topic.NODE_COMMAND_RESULTS].messages == []
    write_faults(agent.state_dir, FaultPlan())
    await send(agent, centre, ProbeNode(node_id=NODE), seq=1)  # seq 1 was never consumed
    assert len(sinks[Topic.NODE_COMMAND_RESULTS].messages) == 1


async def test_a_flapping_node_alternates(
    running: tuple[Agent, dict[Topic, Sink]], monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, sinks = running
    reports = sinks[Topic.NODE_REPORTS]
    watch = LoopWatch(agent, reports, monkeypatch)
    write_faults(agent.state_dir, FaultPlan(flap_s=0.3))
    await agent.start_reporting()

    def resumed() -> int:
        """How often the loop went from a silent phase back to reporting."""
        phases = [silent for silent, _ in itertools.groupby(s for s, _ in watch.ticks)]
        return sum(1 for a, b in itertools.pairwise(phases) if a and not b)

    # Bursts of reports separated by silences (phases of flap_s, however many ticks fit in).
    await eventually(lambda: resumed() >= 2, "two silences, each followed by reports again")
    ticks = list(watch.ticks)
    for (silent, count), (_, next_count) in itertools.pairwise(ticks):
        assert next_count - count == (0 if silent else 1), (silent, count, next_count)
    # The checks above covered both phases (the last tick's report may still be on its way).
    assert {silent for silent, _ in ticks[:-1]} == {True, False}


async def test_reports_carry_peer_probes(
    running: tuple[Agent, dict[Topic, Sink]], settings: AgentSettings
) -> None:
    agent, sinks = running
    agents_dir = agent.state_dir.parent
    # This agent answers probes too, at the address it published.
    own = read_probe_addr(agent.state_dir / PROBE_FILE)
    assert own is not None
    assert (await probe_peer(NODE, own, timeout_s=10.0)).reachable

    peer = EchoListener(agents_dir / "node-002")
    await peer.start()
    (agents_dir / "node-003").mkdir()
    (agents_dir / "node-003" / PROBE_FILE).write_text("127.0.0.1:1\n")  # a killed agent's
    try:
        await agent.start_reporting()
        reports = sinks[Topic.NODE_REPORTS]
        async with asyncio.timeout(DEADLINE_S), reports.arrived:
            await reports.arrived.wait_for(
                lambda: any(NodeReport.model_validate_json(body).peer_probes
                            for _, body in reports.messages)
            )
        probes = next(r.peer_probes for r in reports.parsed(NodeReport) if r.peer_probes)
        assert [(p.peer_node_id, p.reachable) for p in probes] == [
            ("node-002", True), ("node-003", False)
        ]
    finally:
        await peer.close()


async def test_real_jobs_start_after_the_first_report_and_stop_with_the_agent(
    settings: AgentSettings, tmp_path: Path, centre: Any
) -> None:
    settings = settings.model_copy(
        update={"jobs": "train", "interval_s": 0.1, "checkpoint_every_s": 0.5}
    )
    agent = create_agent(settings)
    reports = Sink()
    results = Sink()
    reports.subscribe(agent.broker, topic_name(Topic.NODE_REPORTS, settings.namespace))
    results.subscribe(agent.broker, topic_name(Topic.NODE_COMMAND_RESULTS, settings.namespace))
    await agent.open_local()
    try:
        async with TestKafkaBroker(agent.broker):
            await agent.start_reporting()
            first = (await wait_reports(reports, 1))[0]
            assert [(j.job_id, j.state) for j in first.jobs] == [("node-001.train", "starting")]
            running = await wait_last_report(reports, lambda r: r.jobs[0].state == "running")
            assert running.gpus[0].utilization_pct > 50.0  # the real job loads its GPU
            # Offline stops the job at once (checkpoint, exit), not at the next report.
            await send(agent, centre, DrainNode(node_id=NODE), seq=1)
            await send(agent, centre, OfflineNode(node_id=NODE), seq=2)
            stopped = await wait_last_report(reports, lambda r: r.jobs[0].state == "stopped")
            assert stopped.gpus[0].utilization_pct == 0.0
    finally:
        await agent.stop_reporting()
        await agent.close()
    assert (job_dir(agent.state_dir, "node-001.train") / CHECKPOINT_FILE).exists()


async def wait_results(
    sink: Sink, count: int, timeout_s: float = DEADLINE_S
) -> list[CommandResult]:
    async with asyncio.timeout(timeout_s), sink.arrived:
        await sink.arrived.wait_for(lambda: len(sink.messages) >= count)
    return sink.parsed(CommandResult)


async def test_a_migration_is_answered_when_done_and_its_job_leaves_the_reports(
    running: tuple[Agent, dict[Topic, Sink]], centre: Any, settings: AgentSettings
) -> None:
    agent, sinks = running
    reports, results = sinks[Topic.NODE_REPORTS], sinks[Topic.NODE_COMMAND_RESULTS]
    await agent.start_reporting()
    first = (await wait_reports(reports, 1))[0]
    assert [j.job_id for j in first.jobs] == ["node-001.train", "node-001.infer"]

    await send(agent, centre, MigrateJob(node_id=NODE, job_id="node-001.train",
                                         to_node_id="node-002"), seq=1)
    migrated = (await wait_results(results, 1))[0]
    assert (migrated.action, migrated.outcome, migrated.outputs["checkpoint"]) == (
        "migrate_job", "succeeded", "node-001.train"
    )
    meta = checkpoint_dir(settings.checkpoint_store_dir(), "local", "node-001.train") / META_FILE
    assert json.loads(meta.read_text())["from_node"] == NODE
    later = await wait_last_report(reports, lambda r: len(r.jobs) == 1)
    assert [j.job_id for j in later.jobs] == ["node-001.infer"]

    # Back again (as if migrated home): the standby-style start from the store.
    await send(agent, centre, StartJob(node_id=NODE, job_id="node-001.train",
                                       checkpoint="node-001.train"), seq=2)
    started = (await wait_results(results, 2))[-1]
    assert (started.action, started.outcome, started.outputs["resumed_step"]) == (
        "start_job", "succeeded", migrated.outputs["step"]
    )
    back = await wait_last_report(reports, lambda r: len(r.jobs) == 2)
    assert sorted(j.job_id for j in back.jobs) == ["node-001.infer", "node-001.train"]


async def test_a_standby_agent_runs_only_what_it_is_given(
    settings: AgentSettings, centre: Any
) -> None:
    standby = settings.model_copy(update={"node_id": "standby-1", "jobs": "sim:"})
    agent = create_agent(standby)
    reports, results = Sink(), Sink()
    reports.subscribe(agent.broker, topic_name(Topic.NODE_REPORTS, standby.namespace))
    results.subscribe(agent.broker, topic_name(Topic.NODE_COMMAND_RESULTS, standby.namespace))
    await agent.open_local()
    try:
        async with TestKafkaBroker(agent.broker):
            await agent.start_reporting()
            assert (await wait_reports(reports, 1))[0].jobs == []
            command = centre.command(StartJob(node_id="standby-1", job_id="node-001.infer",
                                              kind="inference"),
                                     node="standby-1", issued_at=now_utc())
            await agent.broker.publish(
                command.model_dump_json().encode(),
                topic=topic_name(Topic.NODE_COMMANDS, standby.namespace), key=b"standby-1",
            )
            started = (await wait_results(results, 1))[0]
            assert (started.outcome, started.outputs["started"]) == ("succeeded", True)
            report = await wait_last_report(reports, lambda r: bool(r.jobs))
            assert [(j.job_id, j.state) for j in report.jobs] == [("node-001.infer", "running")]
    finally:
        await agent.stop_reporting()
        await agent.close()


def test_an_agent_without_jobs_can_still_be_given_some(
    settings: AgentSettings, tmp_path: Path
) -> None:
    jobs = make_jobs(settings.model_copy(update={"jobs": ""}), tmp_path)
    assert isinstance(jobs, JobManager)
    assert jobs.views() == []
    assert jobs.snapshot(now_utc()) == []
    simulated = make_jobs(settings.model_copy(update={"jobs": "sim:"}), tmp_path / "sim")
    assert isinstance(simulated, SimulatedJobs)
    assert simulated.views() == []


async def publish_command(agent: Agent, command: Any) -> None:
    await agent.broker.publish(
        command.model_dump_json().encode(),
        topic=topic_name(Topic.NODE_COMMANDS, agent.settings.namespace),
        key=agent.settings.node_id.encode(),
    )


async def test_an_xid_migration_between_two_real_agents(
    settings: AgentSettings, centre: Any
) -> None:
    # Node A trains; it goes offline (its job checkpoints), its job is migrated to the
    # standby node B, which resumes it with the step counter continuing.
    fast = {"interval_s": 0.1, "checkpoint_every_s": 0.5}
    a = create_agent(settings.model_copy(update={"jobs": "train", **fast}))
    b = create_agent(settings.model_copy(update={"node_id": "standby-1", "jobs": "", **fast}))
    sinks = {agent: (Sink(), Sink()) for agent in (a, b)}
    for agent, (reports, results) in sinks.items():
        reports.subscribe(agent.broker, topic_name(Topic.NODE_REPORTS, settings.namespace))
        results.subscribe(agent.broker,
                          topic_name(Topic.NODE_COMMAND_RESULTS, settings.namespace))
        await agent.open_local()
    job = "node-001.train"
    try:
        async with TestKafkaBroker(a.broker), TestKafkaBroker(b.broker):
            for agent in (a, b):
                await agent.start_reporting()
            a_reports, a_results = sinks[a]
            b_reports, b_results = sinks[b]
            await wait_last_report(a_reports, lambda r: r.jobs[0].progress_pct > 0.1)
            for seq, action in enumerate([DrainNode(node_id=NODE), OfflineNode(node_id=NODE)]):
                await publish_command(a, centre.command(action, seq=seq + 1,
                                                        issued_at=now_utc()))
            await wait_last_report(a_reports, lambda r: r.jobs[0].state == "stopped")
            await publish_command(a, centre.command(
                MigrateJob(node_id=NODE, job_id=job, to_node_id="standby-1"), seq=3,
                issued_at=now_utc(),
            ))
            migrated = (await wait_results(a_results, 3))[-1]
            assert (migrated.action, migrated.outcome) == ("migrate_job", "succeeded")
            gone = await wait_last_report(a_reports, lambda r: r.jobs == [])
            assert gone.mode == "offline"

            await publish_command(b, centre.command(
                StartJob(node_id="standby-1", job_id=job, kind="training", checkpoint=job),
                node="standby-1", issued_at=now_utc(),
            ))
            started = (await wait_results(b_results, 1))[0]
            assert started.outputs["resumed_step"] == migrated.outputs["step"]
            progressed = await wait_last_report(
                b_reports, lambda r: bool(r.jobs) and r.jobs[0].state == "running"
                and r.jobs[0].progress_pct > float(migrated.outputs["progress_pct"]),
            )
            assert [j.job_id for j in progressed.jobs] == [job]
            # Every B report after the start shows progress from A's, never from 0 %.
            resumed = [r.jobs[0].progress_pct for r in b_reports.parsed(NodeReport) if r.jobs]
            assert min(resumed) >= float(migrated.outputs["progress_pct"]) - 1e-3
    finally:
        for agent in (a, b):
            await agent.stop_reporting()
            await agent.close()
