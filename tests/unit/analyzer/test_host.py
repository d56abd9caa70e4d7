"""Host metrics as fault data (a full disk, memory pressure) and storage as part of the load."""

from __future__ import annotations

import pytest

from schemas.events.v1 import Fault
from services.analyzer.host import HostArgs, host_faults, host_only
from services.analyzer.needs import load_balance, offline
from services.analyzer.observation import weighed
from tests.unit.analyzer.test_load_balance import MOVABLE
from tests.unit.analyzer.timeline import at, node, pool

ARGS = HostArgs()  # disk and memory 95 %, 6 reports in a row


@pytest.mark.parametrize(
    ("disk", "memory", "kinds"),
    [(95.0, 95.0, []), (95.1, 10.0, ["disk_full"]), (40.0, 99.0, ["memory_pressure"]),
     (100.0, 100.0, ["disk_full", "memory_pressure"])],
)
def test_host_metrics_out_of_range_are_faults(disk: float, memory: float,
                                              kinds: list[str]) -> None:
    assert [f.kind for f in host_faults(disk, memory, ARGS)] == kinds


def test_the_fault_says_what_was_measured_against_which_range() -> None:
    [fault] = host_faults(97.25, 0.0, ARGS)
    assert fault.detail == "disk 97.2% used > 95%"


def offline_needs(faults: list[Fault], run: int) -> list[str]:
    obs = node(run, faults=faults, run=run)
    return [n.kind for n in offline.detect(obs, offline.Args(), at(run), "analyzer")]


@pytest.mark.parametrize(("run", "raised"), [(2, False), (5, False), (6, True)])
def test_a_full_disk_takes_the_node_offline_only_once_it_has_lasted(run: int,
                                                                     raised: bool) -> None:
    assert offline_needs(host_faults(99.0, 0.0, ARGS), run) == (["offline"] if raised else [])


def test_a_gpu_fault_beside_host_pressure_needs_only_the_usual_two_reports() -> None:
    faults = [*host_faults(99.0, 0.0, ARGS), Fault(kind="xid", code=79, gpu_index=0)]
    assert offline_needs(faults, 2) == ["offline"]
    assert not host_only(faults)


def test_the_offline_need_carries_the_host_evidence() -> None:
    obs = node(6, faults=host_faults(99.0, 0.0, ARGS), run=6)
    [need] = offline.detect(obs, offline.Args(), at(6), "analyzer")
    assert need.action_class == "drain"
    assert "disk 99.0% used > 95%" in need.evidence[0].detail


def test_storage_counts_in_the_load_for_its_weight() -> None:
    assert weighed(50.0, 100.0, 0.0) == 50.0
    assert weighed(50.0, 100.0, 0.2) == 60.0
    full = pool(0, util=70.0).model_copy(update={"storage_pct": 100.0, "storage_weight": 0.5})
    assert full.load_pct == 85.0
    assert full.effective_utilization_pct == 85.0


def test_a_node_hot_by_its_storage_is_a_balance_need_when_storage_is_weighed() -> None:
    args = load_balance.Args(hold_s=0.0)
    gpu_only = node(0, util=70.0, disk_used_pct=100.0, **MOVABLE)
    assert load_balance.evaluate(gpu_only, args, at(0), None, "analyzer").needs == []
    weighed_in = gpu_only.model_copy(update={"storage_weight": 0.5})
    [need] = load_balance.evaluate(weighed_in, args, at(0), None, "analyzer").needs
    assert (need.evidence[0].metric, need.evidence[0].value) == ("node_load_pct", 85.0)
