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
from agent.jobs.kube_pods import KubePods
from agent.jobs.simulated import TRAINING_RUN_S, SimulatedJobs
from agent.journal import Journal
from agent.report import Reporter, fit_to_limit, report_bytes
from agent.settings import AgentSettings
from common.messaging import parse_event
from schemas.events.v1 import GpuMetrics, JobInfo, NodeMode, NodeReport, PeerProbe

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
    # No new inference requests; the job is still the node's, so it is still reported.
    assert [(j.kind, j.state) for j in draining.jobs] == [
        ("training", "running"), ("inference", "stopped")
    ]
    journal.set_mode("offline")
    offline = source.build(now + timedelta(seconds=10), FaultPlan())
    assert [j.state for j in offline.jobs] == ["stopped", "stopped"]  # owned until migrated
    assert all(g.utilization_pct == 0.0 for g in offline.gpus)


def test_a_failing_probe_is_fault_data(journal: Journal, now: datetime) -> None:
    class Broken(SimulatedProbe):
        def read(
            self, jobs: Sequence[JobInfo], now: datetime, load_pct: float | None = None
        ) -> list[GpuMetrics]:
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


def test_interval_comes_from_the_journal(journal: Journal, now: datetime) -> None:
    source = reporter(journal, now)
    assert source.build(now, FaultPlan()).interval_s == 2.0
    journal.set_interval(0.5)  # as a set_report_interval command leaves it
    assert source.interval_s == 0.5
    assert source.build(now + timedelta(seconds=1), FaultPlan()).interval_s == 0.5


def test_peer_probes_reach_the_report(journal: Journal, now: datetime) -> None:
    probes = [
        PeerProbe(peer_node_id=f"node-{n:03d}", reachable=n != 3, rtt_ms=None if n == 3 else 0.2)
        for n in range(2, 22)
    ]
    source = reporter(journal, now)
    source.peer_probes = lambda: probes
    report = source.build(now, FaultPlan())
    assert report.peer_probes == probes[:16]  # the schema's bound, never a rejected report
    assert report.peer_probes[1].reachable is False


def test_load_overrides_what_the_jobs_put_on_the_gpus(journal: Journal, now: datetime) -> None:
    source = reporter(journal, now)
    held = source.build(now, FaultPlan(load_pct=90.0))
    assert all(86.0 <= g.utilization_pct <= 94.0 for g in held.gpus)
    low = source.build(now + timedelta(seconds=2), FaultPlan(load_pct=5.0))
    assert all(g.utilization_pct <= 9.0 for g in low.gpus)
    assert held.faults == low.faults == []


class FrozenJobs:
    """A job source whose training job is hung; records what it was told."""

    def __init__(self) -> None:
        self.told: list[tuple[NodeMode, FaultPlan]] = []

    def start(self) -> None:
        pass

    def reconcile(self, mode: NodeMode, plan: FaultPlan) -> None:
        self.told.append((mode, plan))

    def snapshot(self, now: datetime) -> list[JobInfo]:
        return [JobInfo(job_id="node-001.train", kind="training", state="hung",
                        progress_pct=12.5, gpu_indices=[0])]

    def close(self) -> None:
        pass


def test_hung_jobs_become_fault_data(journal: Journal, now: datetime) -> None:
    jobs = FrozenJobs()
    source = reporter(journal, now)
    source.jobs = jobs
    plan = FaultPlan(hung_job=True)
    journal.set_mode("draining")
    report = source.build(now, plan)
    assert jobs.told == [("draining", plan)]  # the jobs follow the mode and the plan
    assert [(f.kind, f.detail) for f in report.faults] == [
        ("hung_job", "node-001.train: no progress")
    ]
    assert report.jobs[0].progress_pct == 12.5
    assert report.gpus[0].utilization_pct == 0.0  # hung: memory held, no compute


def test_failing_jobs_are_fault_data(journal: Journal, now: datetime) -> None:
    class Broken(FrozenJobs):
        def snapshot(self, now: datetime) -> list[JobInfo]:
            raise OSError("no status")

    source = reporter(journal, now)
    source.jobs = Broken()
    report = source.build(now, FaultPlan())
    assert report.jobs == []
    assert [(f.kind, "no status" in f.detail) for f in report.faults] == [("agent", True)]


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
    assert settings.node_state_dir() == tmp_path / "agents" / "c2" / "node-007"
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


@pytest.mark.parametrize(
    ("value", "stored", "names"),
    [
        ("train,infer", "train,infer", ["train", "infer"]),
        ("infer, train,train", "train,infer", ["train", "infer"]),
        ("infer", "infer", ["infer"]),
        ("", "", []),
        (" sim ", "sim", []),
        ("sim:", "sim:", []),
        ("sim:infer,train", "sim:train,infer", []),
    ],
)
def test_jobs_setting(
    monkeypatch: pytest.MonkeyPatch, value: str, stored: str, names: list[str]
) -> None:
    monkeypatch.setenv("AGENT_NODE_ID", "node-001")
    monkeypatch.setenv("AGENT_JOBS", value)
    settings = AgentSettings()
    assert (settings.jobs, settings.job_names()) == (stored, names)


@pytest.mark.parametrize(
    ("value", "simulated"),
    [("sim", ["train", "infer"]), ("sim:", []), ("sim:infer", ["infer"]), ("train", []),
     ("", [])],
)
def test_simulated_jobs_setting(
    monkeypatch: pytest.MonkeyPatch, value: str, simulated: list[str]
) -> None:
    monkeypatch.setenv("AGENT_NODE_ID", "node-001")
    monkeypatch.setenv("AGENT_JOBS", value)
    settings = AgentSettings()
    assert settings.simulated is value.startswith("sim")
    assert settings.simulated_job_names() == simulated


def test_checkpoint_store_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENT_NODE_ID", "node-001")
    monkeypatch.setenv("WARDEN_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("AGENT_CHECKPOINT_STORE", raising=False)
    assert AgentSettings().checkpoint_store_dir() == tmp_path / "checkpoints"
    monkeypatch.setenv("AGENT_CHECKPOINT_STORE", str(tmp_path / "shared"))
    assert AgentSettings().checkpoint_store_dir() == tmp_path / "shared"


@pytest.mark.parametrize("value", ["train,shell", "sim,train", "TRAIN", "sim:sim", "sim:x"])
def test_unknown_jobs_are_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("AGENT_NODE_ID", "node-001")
    monkeypatch.setenv("AGENT_JOBS", value)
    with pytest.raises(ValidationError):
        AgentSettings()


def test_new_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_NODE_ID", "node-001")
    for name in ("AGENT_JOBS", "AGENT_HUNG_AFTER_S", "AGENT_PROBE_PORT", "AGENT_PEER_PROBES"):
        monkeypatch.delenv(name, raising=False)
    settings = AgentSettings()
    assert (settings.jobs, settings.hung_after_s, settings.checkpoint_every_s) == (
        "train,infer", 30.0, 5.0
    )
    assert (settings.probe_port, settings.peer_probes, settings.probe_timeout_s) == (0, 3, 1.0)
    monkeypatch.setenv("AGENT_PEER_PROBES", "17")  # more than a report may carry
    with pytest.raises(ValidationError):
        AgentSettings()


def test_a_kubernetes_nodes_conditions_are_fault_data_in_its_report(
        journal: Journal, now: datetime) -> None:
    pods = KubePods(NODE, 2, "/k/admin.kubeconfig")
    pods.node = {"metadata": {"name": NODE}, "status": {"conditions": [
        {"type": "Ready", "status": "True"},
        {"type": "KernelDeadlock", "status": "True", "reason": "DockerHung"}]}}
    source = Reporter(node_id=NODE, cluster_id="local", pool="default", interval_s=2.0,
                      probe=SimulatedProbe(2, seed=1), host=HostSampler(), journal=journal,
                      jobs=pods)
    report = source.build(now, FaultPlan())
    assert [(f.kind, f.detail) for f in report.faults] == [
        ("node_condition", "KernelDeadlock=True: DockerHung")]
    assert NodeReport.model_validate_json(report.model_dump_json()) == report


def crowded(report: NodeReport, jobs: int) -> NodeReport:
    """`report` with `jobs` jobs (every third stopped) and a full round of peer probes."""
    many = [JobInfo(job_id=f"job-{index:04d}", kind="training",
                    state="stopped" if index % 3 == 0 else "running", gpu_indices=[0, 1])
            for index in range(jobs)]
    probes = [PeerProbe(peer_node_id=f"node-{index:03d}", reachable=True, rtt_ms=1.0)
              for index in range(2, 18)]
    return report.model_copy(update={"jobs": many, "peer_probes": probes})


def test_a_report_within_the_limit_goes_as_it_is(journal: Journal, now: datetime) -> None:
    report = crowded(reporter(journal, now).build(now, FaultPlan()), 10)
    assert fit_to_limit(report, 65_536) is report


def test_a_report_over_the_limit_sheds_probes_then_the_least_needed_jobs(
        journal: Journal, now: datetime) -> None:
    report = crowded(reporter(journal, now).build(now, FaultPlan(xid=[79])), 900)
    assert report_bytes(report) > 65_536  # as it was, the collector would dead-letter it
    sent = fit_to_limit(report, 65_536)
    body = sent.model_dump_json().encode()
    # The collector's own check takes it, and the heartbeat, metrics and faults all went.
    assert parse_event(NodeReport, body, NODE.encode(), 65_536).seq == report.seq
    assert (sent.gpus, sent.faults, sent.host) == (report.gpus, report.faults, report.host)
    assert sent.peer_probes == []
    assert 0 < len(sent.jobs) < len(report.jobs)
    # Running work, which the centre may have to move, goes before stopped jobs.
    assert {job.state for job in sent.jobs} == {"running"}
    # As many as fit: one more would not.
    leftover = [job for job in report.jobs if job not in sent.jobs and job.state == "running"]
    one_more = sent.model_copy(update={"jobs": [*sent.jobs, leftover[0]]})
    assert report_bytes(one_more) > 65_536


def test_a_report_that_fits_without_its_probes_keeps_every_job(
        journal: Journal, now: datetime) -> None:
    report = crowded(reporter(journal, now).build(now, FaultPlan()), 10)
    limit = report_bytes(report) - 1
    sent = fit_to_limit(report, limit)
    assert (sent.jobs, sent.peer_probes) == (report.jobs, [])


def test_the_agent_fits_its_reports_to_the_message_limit(
        journal: Journal, now: datetime) -> None:
    def build(max_bytes: int | None) -> NodeReport:
        return Reporter(node_id=NODE, cluster_id="local", pool="default", interval_s=2.0,
                        probe=SimulatedProbe(2, seed=1), host=HostSampler(), journal=journal,
                        jobs=SimulatedJobs(NODE, 2, now), max_bytes=max_bytes).build(
                            now, FaultPlan())
    whole = build(None)
    # A job takes far more than the few bytes two builds' metrics may differ by.
    limit = report_bytes(whole) - 100
    fitted = build(limit)
    assert report_bytes(fitted) <= limit
    assert len(fitted.jobs) < len(whole.jobs)
