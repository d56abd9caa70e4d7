"""Fault plans: the file round trip, what they add to a report, and the fleet helpers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.device import SimulatedProbe
from agent.faults import (
    FaultPlan,
    faults_for_report,
    faults_path,
    inject_into_gpus,
    inject_into_host,
    job_faults,
    read_faults,
    reports_paused,
    write_faults,
)
from agent.fleet import agent_dir, clear_faults, inject_fault
from schemas.events.v1 import HostMetrics, JobInfo


def test_round_trip(tmp_path: Path) -> None:
    plan = FaultPlan(
        xid=[79, 48], ecc_uncorrected=3, hung_job=True, silent=True, slow_s=1.5,
        fail_actions=["drain_node", "offline_node"], gpu_index=1, load_pct=85.0, flap_s=5.0,
        ignore_commands=True,
    )
    write_faults(tmp_path, plan)
    assert read_faults(tmp_path) == plan
    assert not plan.healthy
    assert FaultPlan().healthy


@pytest.mark.parametrize(
    "content",
    [
        None,  # missing
        b"{not json",
        b'{"xid": ["79"]}',  # strict: a string is not an XID
        b'{"xid": [79], "rm": "-rf"}',  # unknown field
        b'{"slow_s": NaN}',
        b'{"fail_actions": ["exec_shell"]}',
    ],
)
def test_missing_or_bad_file_means_no_faults(tmp_path: Path, content: bytes | None) -> None:
    if content is not None:
        faults_path(tmp_path).write_bytes(content)
    assert read_faults(tmp_path) == FaultPlan()


def test_faults_for_report() -> None:
    assert faults_for_report(FaultPlan()) == []
    faults = faults_for_report(FaultPlan(xid=[79, 13], ecc_uncorrected=2, hung_job=True))
    # A hung job is not the plan's word: it is found by watching the jobs (job_faults).
    assert [(f.kind, f.code, f.gpu_index) for f in faults] == [
        ("xid", 79, 0),
        ("xid", 13, 0),
        ("ecc", None, 0),
    ]


def job(state: str, job_id: str = "node-001.train") -> JobInfo:
    return JobInfo.model_validate({"job_id": job_id, "kind": "training", "state": state})


def test_job_faults() -> None:
    assert job_faults([job("running")], FaultPlan()) == []
    hung = job_faults([job("hung"), job("running", "node-001.infer")], FaultPlan())
    assert [(f.kind, f.detail) for f in hung] == [("hung_job", "node-001.train: no progress")]
    # Frozen but not yet past the hung threshold: no fault yet, whatever the plan says.
    assert job_faults([job("running")], FaultPlan(hung_job=True)) == []
    # With no job to freeze, the plan's word is the only evidence there can be.
    assert [f.kind for f in job_faults([], FaultPlan(hung_job=True))] == ["hung_job"]
    assert job_faults([], FaultPlan()) == []


@pytest.mark.parametrize(
    ("plan", "second", "paused"),
    [
        (FaultPlan(), 0.0, False),
        (FaultPlan(silent=True), 0.0, True),
        (FaultPlan(flap_s=10.0), 0.0, False),  # [0, 10): reporting
        (FaultPlan(flap_s=10.0), 9.9, False),
        (FaultPlan(flap_s=10.0), 10.0, True),  # [10, 20): silent
        (FaultPlan(flap_s=10.0), 19.9, True),
        (FaultPlan(flap_s=10.0), 20.0, False),
        (FaultPlan(flap_s=0.5), 0.75, True),
        (FaultPlan(flap_s=10.0, silent=True), 0.0, True),
    ],
)
def test_reports_paused(plan: FaultPlan, second: float, paused: bool) -> None:
    epoch = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)  # a multiple of 10 s since 1970
    assert reports_paused(plan, epoch + timedelta(seconds=second)) is paused


def test_flapping_alternates_over_time() -> None:
    plan = FaultPlan(flap_s=2.0)
    start = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
    phases = [reports_paused(plan, start + timedelta(seconds=s)) for s in range(0, 12)]
    assert phases == [False, False, True, True] * 3


@pytest.mark.parametrize(
    "fields", [{"load_pct": 100.5}, {"load_pct": -1.0}, {"flap_s": -1.0}, {"flap_s": 3601.0}]
)
def test_new_fields_are_bounded(fields: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        FaultPlan.model_validate(fields)


def test_load_holds_the_simulated_gpus_near_a_value(now: datetime) -> None:
    probe = SimulatedProbe(4, seed=2)
    readings = [g.utilization_pct for _ in range(50) for g in probe.read([], now, load_pct=85.0)]
    assert min(readings) >= 82.0
    assert max(readings) <= 88.0
    assert abs(sum(readings) / len(readings) - 85.0) < 1.0
    assert len(set(readings)) > 10  # noisy, as a real cluster's would be
    busy = probe.read([], now, load_pct=90.0)[0]
    idle = probe.read([], now)[0]
    assert busy.power_w > idle.power_w
    assert busy.memory_used_mib > idle.memory_used_mib
    # The load overrides what the jobs would put on the GPU, in both directions.
    running = JobInfo(job_id="t", kind="training", state="running", gpu_indices=[0])
    assert probe.read([running], now, load_pct=10.0)[0].utilization_pct < 20.0
    assert all(g.utilization_pct == 0.0 for g in probe.read([running], now, load_pct=0.0))


def test_injected_faults_show_on_the_gpu(now: datetime) -> None:
    gpus = SimulatedProbe(2, seed=1).read([], now)
    assert inject_into_gpus(FaultPlan(hung_job=True), gpus) == gpus
    injected = inject_into_gpus(FaultPlan(xid=[79], ecc_uncorrected=4, gpu_index=1), gpus)
    assert injected[0] == gpus[0]
    assert injected[1].xid_events == [79]
    assert injected[1].ecc_uncorrected_volatile == 4
    assert injected[1].ecc_uncorrected_aggregate == 4


def test_fleet_inject_merges_and_clear_removes(tmp_path: Path) -> None:
    plan = inject_fault(tmp_path, "node-002", xid=[79])
    assert plan == FaultPlan(xid=[79])
    plan = inject_fault(tmp_path, "node-002", silent=True, slow_s=2)
    assert plan == FaultPlan(xid=[79], silent=True, slow_s=2.0)
    plan = inject_fault(tmp_path, "node-002", load_pct=90, flap_s=3.0)
    assert plan == FaultPlan(xid=[79], silent=True, slow_s=2.0, load_pct=90.0, flap_s=3.0)
    plan = inject_fault(tmp_path, "node-002", load_pct=None, silent=False)
    assert (plan.load_pct, plan.silent, plan.flap_s) == (None, False, 3.0)
    home = agent_dir(tmp_path, "node-002")
    assert read_faults(home) == plan
    with pytest.raises(ValidationError):
        inject_fault(tmp_path, "node-002", no_such_fault=True)
    clear_faults(tmp_path, "node-002")
    assert not faults_path(home).exists()
    assert read_faults(home) == FaultPlan()
    clear_faults(tmp_path, "node-002")  # idempotent


def test_the_plan_can_fill_the_disk_and_the_memory() -> None:
    host = HostMetrics(cpu_pct=5.0, memory_used_mib=100, memory_total_mib=1_000,
                       disk_used_pct=40.0)
    assert inject_into_host(FaultPlan(), host) == host
    full = inject_into_host(FaultPlan(disk_used_pct=97.0, memory_used_pct=99.0), host)
    assert (full.disk_used_pct, full.memory_used_mib, full.cpu_pct) == (97.0, 990, 5.0)
