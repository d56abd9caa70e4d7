"""Fault plans: the file round trip, what they add to a report, and the fleet helpers."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.device import SimulatedProbe
from agent.faults import (
    FaultPlan,
    faults_for_report,
    faults_path,
    inject_into_gpus,
    read_faults,
    write_faults,
)
from agent.fleet import agent_dir, clear_faults, inject_fault


def test_round_trip(tmp_path: Path) -> None:
    plan = FaultPlan(
        xid=[79, 48], ecc_uncorrected=3, hung_job=True, silent=True, slow_s=1.5,
        fail_actions=["drain_node", "offline_node"], gpu_index=1,
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
    assert [(f.kind, f.code, f.gpu_index) for f in faults] == [
        ("xid", 79, 0),
        ("xid", 13, 0),
        ("ecc", None, 0),
        ("hung_job", None, None),
    ]


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
    home = agent_dir(tmp_path, "node-002")
    assert read_faults(home) == plan
    with pytest.raises(ValidationError):
        inject_fault(tmp_path, "node-002", no_such_fault=True)
    clear_faults(tmp_path, "node-002")
    assert not faults_path(home).exists()
    assert read_faults(home) == FaultPlan()
    clear_faults(tmp_path, "node-002")  # idempotent
