"""Table tests of the offline need over classified faults."""

from __future__ import annotations

import pytest

from schemas.events.v1 import ActionClass, Fault, GpuMetrics, NeedLevel, NodeStateName
from services.analyzer.faults import FaultArgs
from services.analyzer.needs import offline
from tests.unit.analyzer.timeline import at, gpu, node, report_id

ARGS = offline.Args()  # fault_max 0, 2 consecutive faulty reports
HUNG = Fault(kind="hung_job", detail="no progress for 120s")


def xid(code: int, gpu_index: int = 0) -> Fault:
    return Fault(kind="xid", code=code, gpu_index=gpu_index)


@pytest.mark.parametrize(
    ("faults", "run", "state", "action", "level"),
    [
        pytest.param([xid(79)], 2, "up", "replace", "gpu", id="xid 79 after two reports"),
        pytest.param([xid(79)], 1, "up", None, None, id="one bad report is never enough"),
        pytest.param([xid(48)], 3, "suspect", "reboot", "gpu", id="suspect nodes count"),
        pytest.param([xid(13)], 5, "up", None, None, id="an application xid alone"),
        pytest.param([xid(43), xid(999)], 5, "up", None, None, id="application and unknown"),
        pytest.param([xid(13), xid(94)], 2, "up", "reboot", "gpu", id="the fatal one counts"),
        pytest.param([HUNG], 2, "up", "drain", "node", id="hung job"),
        pytest.param([Fault(kind="probe_failed")], 2, "up", "drain", "node", id="failed probe"),
        pytest.param([Fault(kind="node_condition", detail="GPUProblem=True")], 2, "up",
                     "drain", "node", id="a Kubernetes node condition"),
        pytest.param([xid(79), HUNG], 2, "up", "replace", "node", id="gpu and node faults"),
        pytest.param([xid(79)], 5, "draining", None, None, id="already leaving service"),
        pytest.param([xid(79)], 5, "offline", None, None, id="already out of service"),
        pytest.param([], 0, "down", "drain", "node", id="heartbeat missed beyond the grace"),
    ],
)
def test_offline_need(faults: list[Fault], run: int, state: NodeStateName,
                      action: ActionClass | None, level: NeedLevel | None) -> None:
    needs = offline.detect(node(0, state=state, faults=faults, run=run), ARGS, at(5), "analyzer")
    assert [(n.action_class, n.level) for n in needs] == ([(action, level)] if action else [])
    for need in needs:
        assert (need.kind, need.target, need.pool) == ("offline", "node-007", "train")
        assert need.evidence[0].source_event_id == report_id(0)
        assert need.occurred_at == at(5)


@pytest.mark.parametrize(
    ("gpus", "action"),
    [
        pytest.param([gpu(0, ecc_uncorrected_volatile=3)], "reboot", id="uncorrected ECC"),
        pytest.param([gpu(0), gpu(5, xid_events=[119])], "replace", id="xid in the metrics"),
        pytest.param([gpu(0, xid_events=[31])], None, id="application xid in the metrics"),
    ],
)
def test_gpu_metrics_are_fault_data(gpus: list[GpuMetrics], action: ActionClass | None) -> None:
    needs = offline.detect(node(0, gpus=gpus, run=2), ARGS, at(0), "analyzer")
    assert [n.action_class for n in needs] == ([action] if action else [])


def test_evidence_names_the_xids_and_their_class() -> None:
    faults = [xid(79, 1), xid(48, 2), xid(13, 2)]
    [need] = offline.detect(node(0, faults=faults, run=3), ARGS, at(0), "analyzer")
    summary, gpu1, gpu2 = need.evidence
    assert (summary.metric, summary.value, summary.range_high) == ("node_fault_count", 2.0, 0.0)
    assert summary.detail.startswith("3 consecutive faulty reports; ")
    assert "xid 79 on gpu 1: replace" in summary.detail
    assert "recorded only: xid 13 on gpu 2" in summary.detail
    assert (gpu1.metric, gpu1.value, gpu1.detail) == (
        "gpu1_fault_count", 1.0, "xid 79 on gpu 1: replace")
    assert (gpu2.metric, gpu2.detail) == ("gpu2_fault_count", "xid 48 on gpu 2: reboot")


@pytest.mark.parametrize(
    ("fault_max", "faults", "raised"),
    [
        (1, [xid(79, 0), xid(13, 1)], False),  # one counted fault is within a range of 1
        (1, [xid(79, 0), xid(94, 1)], True),
        (0, [xid(13, 0), xid(13, 1), xid(13, 2)], False),  # recorded faults never count
    ],
)
def test_fault_range_counts_only_counted_faults(fault_max: int, faults: list[Fault],
                                                raised: bool) -> None:
    args = offline.Args(fault_max=fault_max)
    assert bool(offline.detect(node(0, faults=faults, run=3), args, at(0), "analyzer")) is raised


def test_repeated_faults_escalate_to_replace() -> None:
    observation = node(0, faults=[xid(48, 2)], run=2)
    [need] = offline.detect(observation, ARGS, at(0), "analyzer", recent_fatal={2: 4})
    assert need.action_class == "replace"
    assert "reboot->replace" in need.evidence[0].detail


def test_classification_is_an_argument() -> None:
    args = offline.Args(faults=FaultArgs(xid_overrides={13: "reboot"}))
    [need] = offline.detect(node(0, faults=[xid(13)], run=2), args, at(0), "analyzer")
    assert need.action_class == "reboot"


@pytest.mark.parametrize("dry_run", [True, False])
def test_dry_run_is_copied_onto_the_need(dry_run: bool) -> None:
    observation = node(0, faults=[xid(79)], run=2)
    [need] = offline.detect(observation, ARGS, at(0), "analyzer", dry_run=dry_run)
    assert need.dry_run is dry_run


def test_id_is_deterministic_per_report() -> None:
    first = offline.detect(node(0, faults=[xid(79)], run=2), ARGS, at(0), "analyzer")
    again = offline.detect(node(0, faults=[xid(79)], run=2), ARGS, at(9), "analyzer")
    other = offline.detect(node(1, faults=[xid(79)], run=3), ARGS, at(9), "analyzer")
    assert first[0].event_id == again[0].event_id != other[0].event_id


def test_default_args() -> None:
    assert offline.Args().model_dump() == {
        "fault_max": 0, "min_consecutive_reports": 2,
        "faults": {"xid_overrides": {}, "ecc_corrected_max": None, "repeat_threshold": 5,
                   "repeat_window_s": 86_400.0},
        "host": {"disk_max_pct": 95.0, "memory_max_pct": 95.0, "min_consecutive_reports": 6},
    }


def test_peers_that_cannot_reach_a_reporting_node_take_it_offline() -> None:
    cut_off = Fault(kind="partitioned", detail="0 peer(s) reach it, 2 cannot (quorum 2)")
    needs = offline.detect(node(0, faults=[cut_off], run=2), ARGS, at(5), "analyzer")
    assert [(n.kind, n.action_class, n.level) for n in needs] == [("offline", "drain", "node")]
    assert "partitioned [0 peer(s) reach it, 2 cannot (quorum 2)]" in needs[0].evidence[0].detail
