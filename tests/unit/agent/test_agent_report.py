"""Building reports: host metrics, simulated jobs, fault plans, mode and seq."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.device import SimulatedProbe
from agent.faults import FaultPlan
from agent.host import HostSampler, NetCounters, net_rates
from agent.jobs import TRAINING_RUN_S, SimulatedJobs
from agent.journal import Journal
from agent.report import Reporter
from agent.settings import AgentSettings
from schemas.events.v1 import GpuMetrics, JobInfo, NodeReport

NODE = "node-001"


def reporter(journal: Journal, now: datetime, gpus: int = 2) -> Reporter:
    return Reporter(
        node_id=NODE,
        cluster_id="local",
        pool="default",
        interval_s=2.0,
        probe=SimulatedProbe(gpus, seed=1),
        host=HostSampler(),
        journal=journal,
        jobs=SimulatedJobs(NODE, gpus, now),
    )


def test_healthy_report(journal: Journal, now: datetime) -> None:
    report = reporter(journal, now).build(now, FaultPlan())
    assert isinstance(report, NodeReport)
    assert (report.node_id, report.subject, report.source) == (NODE, NODE, f"agent-{NODE}")
    assert report.gpu_source == "simulated"
    assert report.mode == "active"
    assert report.faults == []
    assert report.peer_probes == []
    assert [j.kind for j in report.jobs] == ["training", "inference"]
    assert report.gpus[0].utilization_pct > 50.0  # the training job loads GPU 0
    assert report.host.memory_total_mib > 0
    # The report survives a strict round trip, as the collector will parse it.
    assert NodeReport.model_validate_json(report.model_dump_json()) == report


def test_seq_rises_and_progress_advances(journal: Journal, now: datetime) -> None:
    source = reporter(journal, now)
    first = source.build(now + timedelta(seconds=60), FaultPlan())
    second = source.build(now + timedelta(seconds=120), FaultPlan())
    assert second.seq > first.seq >= int(now.timestamp() * 1000)
    assert second.jobs[0].progress_pct == pytest.approx(first.jobs[0].progress_pct * 2)


def test_injected_faults_reach_the_report(journal: Journal, now: datetime) -> None:
    plan = FaultPlan(xid=[79], ecc_uncorrected=2, hung_job=True)
    source = reporter(journal, now)
    report = source.build(now + timedelta(seconds=30), plan)
    assert {(f.kind, f.code) for f in report.faults} == {
        ("xid", 79), ("ecc", None), ("hung_job", None)
    }
    assert report.gpus[0].xid_events == [79]
    assert report.gpus[0].ecc_uncorrected_volatile == 2
    training = report.jobs[0]
    assert training.state == "hung"
    assert report.gpus[0].utilization_pct == 0.0  # hung: memory held, no compute
    frozen = training.progress_pct
    later = source.build(now + timedelta(seconds=90), plan)
    assert later.jobs[0].progress_pct == frozen


def test_mode_comes_from_the_journal(journal: Journal, now: datetime) -> None:
    source = reporter(journal, now)
    journal.set_mode("draining")
    draining = source.build(now, FaultPlan())
    assert draining.mode == "draining"
    assert [j.kind for j in draining.jobs] == ["training"]  # no new inference requests
    journal.set_mode("offline")
    offline = source.build(now + timedelta(seconds=10), FaultPlan())
    assert offline.jobs[0].state == "stopped"
    assert all(g.utilization_pct == 0.0 for g in offline.gpus)


def test_a_failing_probe_is_fault_data(journal: Journal, now: datetime) -> None:
    class Broken(SimulatedProbe):
        def read(self, jobs: Sequence[JobInfo], now: datetime) -> list[GpuMetrics]:
            raise RuntimeError("GPU is lost")

    source = reporter(journal, now)
    source.probe = Broken(2)
    report = source.build(now, FaultPlan())
    assert report.gpus == []
    assert report.faults[0].kind == "agent"
    assert "GPU is lost" in report.faults[0].detail


def test_jobs_without_gpus(journal: Journal, now: datetime) -> None:
    report = reporter(journal, now, gpus=0).build(now, FaultPlan(xid=[79]))
    assert report.gpus == []
    assert [j.gpu_indices for j in report.jobs] == [[], []]
    assert report.faults[0].code == 79


def test_training_wraps_after_a_run(now: datetime) -> None:
    jobs = SimulatedJobs(NODE, 1, now)
    jobs.advance(now + timedelta(seconds=TRAINING_RUN_S * 1.5), "active", hung=False)
    assert jobs.runs == 1
    assert jobs.progress_pct == pytest.approx(50.0)


# ---------------------------------------------------------------- host


def test_net_rates(now: datetime) -> None:
    before = NetCounters(now, 1_000, 5_000)
    after = NetCounters(now + timedelta(seconds=2), 3_000, 5_000)
    assert net_rates(None, after) == (0.0, 0.0)
    assert net_rates(before, after) == (1_000.0, 0.0)
    assert net_rates(after, before) == (0.0, 0.0)  # time went backwards
    reset = NetCounters(now + timedelta(seconds=4), 10, 10)
    assert net_rates(after, reset) == (0.0, 0.0)  # counters reset


def test_host_sampler_reads_this_machine(now: datetime) -> None:
    sampler = HostSampler()
    first = sampler.read(now)
    second = sampler.read(now + timedelta(seconds=1))
    for metrics in (first, second):
        assert 0.0 <= metrics.cpu_pct <= 100.0
        assert 0 < metrics.memory_used_mib <= metrics.memory_total_mib
        assert 0.0 <= metrics.disk_used_pct <= 100.0
    assert first.net_rx_bytes_per_s == 0.0  # no earlier counters yet


# ---------------------------------------------------------------- settings


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENT_NODE_ID", "node-007")
    monkeypatch.setenv("AGENT_GPUS", "8")
    monkeypatch.setenv("AGENT_TRUSTED_KEYS", f"{tmp_path}/a.pem, {tmp_path}/b.pem,")
    monkeypatch.setenv("WARDEN_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("WARDEN_CLUSTER_ID", "c2")
    settings = AgentSettings()
    assert settings.node_id == "node-007"
    assert settings.gpus == 8
    assert settings.trusted_keys == [tmp_path / "a.pem", tmp_path / "b.pem"]
    assert settings.node_state_dir() == tmp_path / "agents" / "node-007"
    assert settings.service_name() == "agent-c2-node-007"
    assert (settings.command_leeway_s, settings.max_command_ttl_s) == (30.0, 300.0)
    monkeypatch.setenv("AGENT_STATE_DIR", str(tmp_path / "elsewhere"))
    assert AgentSettings().node_state_dir() == tmp_path / "elsewhere"


def test_settings_without_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_NODE_ID", "node-001")
    monkeypatch.delenv("AGENT_TRUSTED_KEYS", raising=False)
    assert AgentSettings().trusted_keys == []


@pytest.mark.parametrize(
    ("name", "value"), [("AGENT_NODE_ID", "node 1; rm"), ("AGENT_GPUS", "65")]
)
def test_settings_are_validated(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv("AGENT_NODE_ID", "node-001")
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError):
        AgentSettings()
