"""Table tests of the online need: an offline node fault-free for its hold period."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from pydantic import ValidationError

from schemas.events.v1 import Fault, GpuMetrics, NodeStateName, OpsNeed
from services.analyzer.conditions import ConditionState, Evaluation
from services.analyzer.faults import FaultArgs
from services.analyzer.needs import online
from services.analyzer.observation import NodeObservation
from tests.unit.analyzer.timeline import Evaluator, at, gpu, node, raised_at, report_id, run

ARGS = online.Args()  # hold 300 s
XID_79 = Fault(kind="xid", code=79, gpu_index=0)
XID_13 = Fault(kind="xid", code=13, gpu_index=0)
HUNG = Fault(kind="hung_job", detail="no progress for 120s")
# Seconds after T0, the node's state, the faults it reports.
Point = tuple[float, NodeStateName, Sequence[Fault]]
CLEAN: Sequence[Fault] = ()


def evaluate_with(args: online.Args, dry_run: bool = False) -> Evaluator[NodeObservation]:
    def step(obs: NodeObservation, prior: ConditionState | None) -> Evaluation:
        return online.evaluate(obs, args, at(999), prior, "analyzer", dry_run)
    return step


def timeline(points: list[Point], args: online.Args = ARGS,
             dry_run: bool = False) -> list[list[OpsNeed]]:
    observations = [node(t, state=s, faults=f) for t, s, f in points]
    return run(evaluate_with(args, dry_run), observations)


def kinds(points: list[Point], args: online.Args = ARGS) -> list[tuple[float, str]]:
    return raised_at(timeline(points, args), [p[0] for p in points])


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        pytest.param([(0, "offline", CLEAN), (150, "offline", CLEAN), (301, "offline", CLEAN)],
                     [(301, "online")], id="fault-free for the hold"),
        pytest.param([(0, "offline", CLEAN), (299, "offline", CLEAN)], [],
                     id="short of the hold"),
        pytest.param([(0, "offline", CLEAN), (301, "offline", CLEAN), (400, "offline", CLEAN)],
                     [(301, "online")], id="one raise per episode"),
        pytest.param([(0, "offline", CLEAN), (200, "offline", [XID_79]),
                      (301, "offline", CLEAN), (600, "offline", CLEAN),
                      (601, "offline", CLEAN)], [(601, "online")],
                     id="a fault resets the hold"),
        pytest.param([(0, "offline", CLEAN), (200, "offline", [HUNG]), (301, "offline", CLEAN)],
                     [], id="a node fault resets the hold too"),
        pytest.param([(0, "offline", CLEAN), (200, "offline", [XID_13]),
                      (301, "offline", CLEAN)], [(301, "online")],
                     id="an application XID is recorded, not counted"),
        pytest.param([(0, "up", CLEAN), (301, "up", CLEAN)], [], id="only offline nodes"),
        pytest.param([(0, "offline", CLEAN), (100, "draining", CLEAN), (301, "offline", CLEAN),
                      (601, "offline", CLEAN)], [(601, "online")],
                     id="leaving offline ends the episode"),
    ],
)
def test_online_timeline(points: list[Point], expected: list[tuple[float, str]]) -> None:
    assert kinds(points) == expected


@pytest.mark.parametrize(
    ("gpus", "healthy"),
    [
        pytest.param([gpu(0)], True, id="healthy gpu metrics"),
        pytest.param([gpu(0, ecc_uncorrected_volatile=1)], False,
                     id="an uncorrected ECC error still on the counter (no reboot yet)"),
        pytest.param([gpu(0), gpu(1, xid_events=[48])], False, id="an XID in the gpu metrics"),
        pytest.param([gpu(0, xid_events=[43])], True, id="an application XID in the metrics"),
    ],
)
def test_gpu_metrics_count_as_fault_data(gpus: list[GpuMetrics], healthy: bool) -> None:
    steps = run(evaluate_with(ARGS), [node(0, state="offline", gpus=gpus),
                                      node(301, state="offline", gpus=gpus)])
    assert bool(steps[1]) is healthy


def test_unlisted_faults_are_not_proof_of_health() -> None:
    observations = [node(t, state="offline", fault_count=1) for t in (0, 301)]
    assert run(evaluate_with(ARGS), observations) == [[], []]


def test_classification_is_an_argument() -> None:
    strict = online.Args(faults=FaultArgs(xid_overrides={13: "reboot"}))
    points: list[Point] = [(0, "offline", CLEAN), (200, "offline", [XID_13]),
                           (301, "offline", CLEAN)]
    assert kinds(points, strict) == []


def test_need_carries_full_evidence() -> None:
    [[], [need]] = timeline([(0, "offline", CLEAN), (301, "offline", CLEAN)])
    assert (need.kind, need.level, need.target, need.pool, need.action_class) == (
        "online", "node", "node-007", "train", None)
    [evidence] = need.evidence
    assert (evidence.metric, evidence.value, evidence.range_low, evidence.range_high) == (
        "node_fault_count", 0.0, 0.0, 0.0)
    assert evidence.source_event_id == report_id(301)
    assert evidence.observed_at == at(301)
    assert "held 301s" in evidence.detail
    assert "hold 300s" in evidence.detail


@pytest.mark.parametrize("dry_run", [True, False])
def test_dry_run_is_copied_onto_the_need(dry_run: bool) -> None:
    [[], [need]] = timeline([(0, "offline", CLEAN), (301, "offline", CLEAN)], dry_run=dry_run)
    assert need.dry_run is dry_run


def test_ids_are_deterministic_per_episode() -> None:
    points: list[Point] = [(0, "offline", CLEAN), (301, "offline", CLEAN),
                           (310, "offline", [XID_79]), (320, "offline", CLEAN),
                           (620, "offline", CLEAN)]
    first = [n.event_id for needs in timeline(points) for n in needs]
    assert first == [n.event_id for needs in timeline(points) for n in needs]
    assert len(set(first)) == 2


@pytest.mark.parametrize("fields", [{"hold_s": -1.0}, {"fault_max": 1}])
def test_args_are_validated(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        online.Args.model_validate(fields)


def test_default_hold() -> None:
    assert online.Args().hold_s == 300.0
