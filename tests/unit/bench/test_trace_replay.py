"""The pure parts of the fleet simulator and the trace replayer (no broker, no Redis)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import uuid4

import pytest

from bench.common import percentile
from bench.fleet_sim import (
    ActiveFault,
    FaultyReport,
    FleetSim,
    SimNode,
    build_report,
    consume_faults,
    slot_count,
    slot_members,
)
from bench.trace_replay.figures import Injection, attribute, compressed_env, minute_index
from bench.trace_replay.philly import busy_jobs
from bench.trace_replay.traces import (
    BusyAssigner,
    PhillyMinute,
    TitanEvent,
    busy_target,
    read_philly,
    read_titan,
    titan_faults,
    trace_time,
)
from common.signing import ensure_keypair, signer_from_file, verifier_from_files
from schemas.events.v1 import (
    CommandPayload,
    DrainNode,
    Evidence,
    Fault,
    NodeReport,
    OpsNeed,
    ProbeNode,
)
from services.analyzer.faults import FaultArgs, classify

NOW = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def test_report_is_strictly_valid_and_shows_its_faults() -> None:
    node = SimNode("node-7", load_pct=62.5, seq=3)
    node.faults = [ActiveFault(Fault(kind="xid", code=79, gpu_index=1), 2, "e1"),
                   ActiveFault(Fault(kind="ecc", gpu_index=1))]
    report = build_report(node, "c1", "default", 0.5, 2, NOW)
    again = NodeReport.model_validate_json(report.model_dump_json())
    assert again == report
    assert (again.subject, again.node_id, again.seq) == ("node-7", "node-7", 3)
    assert again.gpu_source == "simulated"
    assert [g.utilization_pct for g in again.gpus] == [62.5, 62.5]
    assert again.gpus[0].xid_events == []
    assert again.gpus[1].xid_events == [79]
    assert again.gpus[1].ecc_uncorrected_volatile == 1
    assert len(again.faults) == 2


def test_faults_last_their_number_of_reports() -> None:
    node = SimNode("n")
    node.faults = [ActiveFault(Fault(kind="xid", code=48, gpu_index=0), 2, "a"),
                   ActiveFault(Fault(kind="agent"))]
    assert consume_faults(node) == ("a",)
    assert consume_faults(node) == ("a",)
    assert consume_faults(node) == ()
    assert [a.fault.kind for a in node.faults] == ["agent"]  # untimed: until cleared


@pytest.mark.parametrize(("nodes", "interval"), [(1, 1.0), (7, 0.05), (100, 0.25), (5000, 10)])
def test_every_node_reports_once_per_interval(nodes: int, interval: float) -> None:
    slots = slot_count(nodes, interval)
    seen = [i for s in range(slots) for i in slot_members(nodes, slots, s)]
    assert sorted(seen) == list(range(nodes))


def _signed(tmp_path: Path, action: ProbeNode | DrainNode, expires_in_s: float = 30.0,
            ) -> tuple[bytes, bytes, FleetSim]:
    private, public = ensure_keypair(tmp_path / "keys", "executor")
    now = datetime.now(UTC)
    payload = CommandPayload(command_id=uuid4(), cluster_id="c1", node_id=action.node_id,
                             seq=0, epoch=1,
                             issued_at=now, expires_at=now + timedelta(seconds=expires_in_s),
                             action=action)
    command = signer_from_file(private).sign(payload, "executor")
    sim = FleetSim("unused:9092", "ns", "c1", ["n1", "n2"], interval_s=1.0,
                   verifier=verifier_from_files([public]))
    return command.model_dump_json().encode(), action.node_id.encode(), sim


def test_probe_is_answered_by_a_live_node_only(tmp_path: Path) -> None:
    body, key, sim = _signed(tmp_path, ProbeNode(node_id="n1"))
    result = sim.answer(body, key)
    assert result is not None
    assert (result.outcome, result.action, result.node_id) == ("succeeded", "probe_node", "n1")
    sim.silence("n1")
    assert sim.answer(body, key) is None
    assert sim.stats.probes_answered == 1


def test_unsigned_or_tampered_commands_are_not_answered(tmp_path: Path) -> None:
    body, key, sim = _signed(tmp_path, ProbeNode(node_id="n1"))
    tampered = body.replace(b'"sig":"', b'"sig":"AA')
    assert sim.answer(tampered, key) is None
    assert sim.stats.commands_unverified == 1


def test_other_commands_are_refused_with_a_reason(tmp_path: Path) -> None:
    body, key, sim = _signed(tmp_path, DrainNode(node_id="n2"))
    result = sim.answer(body, key)
    assert result is not None
    assert (result.outcome, result.reason) == ("failed", "not_supported_by_simulator")


def test_busy_assignment_is_sticky() -> None:
    nodes = [f"n{i}" for i in range(10)]
    assigner = BusyAssigner(nodes, seed=1)
    started, stopped = assigner.assign(6)
    assert (len(started), stopped) == (6, [])
    before = set(assigner.busy)
    started, stopped = assigner.assign(4)
    assert (started, len(stopped)) == ([], 2)
    assert set(assigner.busy) <= before
    started, _ = assigner.assign(11)
    assert (len(assigner.busy), len(started)) == (10, 6)


def test_busy_share_follows_the_trace() -> None:
    minute = PhillyMinute(trace_time("2017-10-03 00:00:00"), 312, 420)
    assert busy_target(minute, 100) == 74
    assert busy_target(PhillyMinute(minute.time, 0, 0), 100) == 0


def test_trace_windows(tmp_path: Path) -> None:
    philly = tmp_path / "philly.csv"
    philly.write_text("time,active,total\n" + "".join(
        f"2017-10-03 00:0{i}:00,{300 + i},420\n" for i in range(6)))
    rows = read_philly(philly, trace_time("2017-10-03 00:02"), 3)
    assert [r.active for r in rows] == [302, 303, 304]
    titan = tmp_path / "titan.csv"
    titan.write_text("event_time,node,SN,event,insert,out\n"
                     "2016-07-02 01:00:00,c1-0c0s1n1,011,OTB,,\n"
                     "2016-07-01 05:00:00,c2-0c0s1n1,022,DBE,,\n"
                     "2016-07-09 00:00:00,c3-0c0s1n1,033,DBE,,\n")
    events = read_titan(titan, trace_time("2016-07-01"), 7)
    assert [e.node for e in events] == ["c2-0c0s1n1", "c1-0c0s1n1"]


def test_titan_classes_map_to_what_the_analyzer_acts_on() -> None:
    at = trace_time("2016-07-01 05:00:00")
    dbe = titan_faults(TitanEvent(at, "c2-0c0s1n1", "022", "DBE"))
    otb = titan_faults(TitanEvent(at, "c2-0c0s1n1", "022", "OTB"))
    assert [(f.kind, f.code) for f in dbe] == [("xid", 48), ("ecc", None)]
    assert [(f.kind, f.code) for f in otb] == [("xid", 79)]
    assert classify(dbe, (), FaultArgs()).action_class == "reboot"
    assert classify(otb, (), FaultArgs()).action_class == "replace"


def test_compressed_settings_scale_the_service_defaults() -> None:
    env = compressed_env(0.5 / 60, 0.25, 0.25, 4)
    assert float(env["ANALYZER_SCALE__HOLD_S"]) == pytest.approx(0.5)
    assert float(env["ANALYZER_ONLINE__HOLD_S"]) == pytest.approx(2.5)
    assert env["ANALYZER_OPEN_NEED_TTL_S"] == "5"
    assert compressed_env(1e-6, 1.0, 1.0, 4)["ANALYZER_OPEN_NEED_TTL_S"] == "1"


def test_figures() -> None:
    assert minute_index(100.0, 100.0, 0.5) == 0
    assert minute_index(100.74, 100.0, 0.5) == 1
    assert minute_index(99.9, 100.0, 0.5) == -1
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0


def _offline_need(node: str, report_id: str, at: float) -> OpsNeed:
    when = datetime.fromtimestamp(at, UTC)
    return OpsNeed(event_id=uuid4(), source="analyzer", occurred_at=when, cluster_id="c1",
                   subject=node, correlation_id=report_id, kind="offline", target=node,
                   evidence=[Evidence(metric="node_fault_count", value=1.0, range_low=0.0,
                                      range_high=0.0, observed_at=when)])


def test_needs_are_traced_back_to_the_injections_in_their_report() -> None:
    injections = [Injection("e0", "a", "OTB", 100.0, True),
                  Injection("e1", "a", "DBE", 100.5, False),  # a repeat, same episode
                  Injection("e2", "b", "DBE", 110.0, True),
                  Injection("e3", "b", "DBE", 113.0, True),  # after its faults, need open
                  Injection("e4", "c", "DBE", 120.0, True)]  # nothing raised: missed
    reports = {"r1": FaultyReport("a", "r1", 101.0, ("e0", "e1")),
               "r2": FaultyReport("b", "r2", 111.0, ("e2",))}
    needs = [(_offline_need("a", "r1", 101.1), 101.2), (_offline_need("b", "r2", 111.1), 111.2),
             (_offline_need("d", "probe", 130.0), 130.1)]
    found = attribute(injections, needs, reports, open_need_ttl_s=5.0, grace_s=3.0)
    assert found.need_at == {"e0": 101.2, "e1": 101.2, "e2": 111.2}
    assert (found.covered, found.missed, found.untraced) == (["e3"], ["e4"], 1)
    assert found.untraced_nodes == {"d"}


@pytest.mark.parametrize(("kind", "movable"), [("whole-node", False), ("movable", True)])
def test_philly_busy_nodes_report_their_job_and_whether_it_can_move(
    kind: str, movable: bool
) -> None:
    node = SimNode("philly-0001", load_pct=90.0, seq=1, jobs=busy_jobs("philly-0001", kind))
    report = build_report(node, "c1", "default", 0.5, 1, NOW)
    [job] = NodeReport.model_validate_json(report.model_dump_json()).jobs
    assert (job.movable, job.gang, job.whole_node) == (movable, not movable, not movable)
    assert busy_jobs("philly-0001", "none") == []
