"""Table tests of the load-balance need: a node out of range in a pool inside its own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.events.v1 import NodeStateName, OpsNeed
from services.analyzer.conditions import ConditionState, Evaluation
from services.analyzer.needs import load_balance
from services.analyzer.observation import NodeLoad, NodeObservation, PoolSpread
from tests.unit.analyzer.timeline import Evaluator, at, node, raised_at, report_id, run

ARGS = load_balance.Args()  # node 20-80 % (exits 25/75), pool 20-80 %, hold 60 s
# Seconds after T0, node GPU utilisation %, pool effective utilisation % (None: unknown), state.
Point = tuple[float, float, float | None, NodeStateName]


def evaluate_with(args: load_balance.Args, dry_run: bool = False) -> Evaluator[NodeObservation]:
    def step(obs: NodeObservation, prior: ConditionState | None) -> Evaluation:
        return load_balance.evaluate(obs, args, at(999), prior, "analyzer", dry_run)
    return step


# A pool where moving work helps at both ends: node-007 runs two movable jobs, node-002 (30 %)
# has room, node-003 (90 %) runs a movable job.
SPREAD = PoolSpread(
    lowest=(NodeLoad(node_id="node-002", load_pct=30.0), NodeLoad(node_id="node-007",
                                                                   load_pct=50.0)),
    busiest_movable=(NodeLoad(node_id="node-003", load_pct=90.0),),
)
MOVABLE: dict[str, Any] = {"movable_jobs": 2, "spread": SPREAD}


def timeline(points: list[Point], args: load_balance.Args = ARGS,
             dry_run: bool = False, **context: Any) -> list[list[OpsNeed]]:
    observations = [node(t, util=u, pool_util=p, state=s, **(MOVABLE | context))
                    for t, u, p, s in points]
    return run(evaluate_with(args, dry_run), observations)


def kinds(points: list[Point], args: load_balance.Args = ARGS,
          **context: Any) -> list[tuple[float, str]]:
    return raised_at(timeline(points, args, **context), [p[0] for p in points])


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        pytest.param([(0, 90, 50, "up"), (30, 90, 50, "up"), (61, 90, 50, "up")],
                     [(61, "load_balance")], id="an overloaded node in a pool in range"),
        pytest.param([(0, 5, 50, "up"), (61, 5, 50, "up")],
                     [(61, "load_balance")], id="an idle node in a pool in range"),
        pytest.param([(0, 90, 50, "up"), (10, 90, 50, "up"), (20, 50, 50, "up"),
                      (80, 50, 50, "up")], [], id="a 10-second spike raises nothing"),
        pytest.param([(0, 90, 50, "up"), (61, 90, 50, "up"), (120, 95, 50, "up")],
                     [(61, "load_balance")], id="one raise per episode"),
        pytest.param([(0, 90, 50, "up"), (30, 78, 50, "up"), (61, 78, 50, "up")],
                     [(61, "load_balance")], id="78 % stays in force above the 75 % exit"),
        pytest.param([(0, 78, 50, "up"), (61, 78, 50, "up")], [],
                     id="78 % never starts a condition"),
        pytest.param([(0, 22, 50, "up"), (61, 22, 50, "up")], [],
                     id="22 % never starts a low condition"),
        pytest.param([(0, 90, 50, "up"), (61, 90, 50, "up"), (70, 60, 50, "up"),
                      (80, 90, 50, "up"), (141, 90, 50, "up")],
                     [(61, "load_balance"), (141, "load_balance")],
                     id="exit then re-enter starts a new episode"),
        pytest.param([(0, 90, 85, "up"), (61, 90, 85, "up")], [],
                     id="suppressed while the pool itself is above its range"),
        pytest.param([(0, 5, 10, "up"), (61, 5, 10, "up")], [],
                     id="suppressed while the pool itself is below its range"),
        pytest.param([(0, 90, 50, "up"), (30, 90, 85, "up"), (61, 90, 50, "up"),
                      (100, 90, 50, "up"), (121, 90, 50, "up")], [(121, "load_balance")],
                     id="the pool leaving its range ends the episode"),
        pytest.param([(0, 90, None, "up"), (61, 90, None, "up")], [],
                     id="no need while the pool's utilisation is unknown"),
        pytest.param([(0, 90, 50, "suspect"), (61, 90, 50, "suspect")], [],
                     id="only nodes that are up count"),
        pytest.param([(0, 90, 50, "up"), (30, 90, 50, "draining"), (61, 90, 50, "up"),
                      (122, 90, 50, "up")], [(122, "load_balance")],
                     id="leaving state up ends the episode"),
    ],
)
def test_load_balance_timeline(points: list[Point], expected: list[tuple[float, str]]) -> None:
    assert kinds(points) == expected


def test_need_names_the_node_and_both_ranges() -> None:
    [[], [need]] = timeline([(0, 92, 55, "up"), (61, 92, 55, "up")])
    assert (need.kind, need.level, need.target, need.subject, need.pool) == (
        "load_balance", "node", "node-007", "node-007", "train")
    node_evidence, pool_evidence = need.evidence
    assert node_evidence.metric == "node_gpu_utilization_pct"
    assert (node_evidence.value, node_evidence.range_low, node_evidence.range_high) == (
        92.0, 20.0, 80.0)
    assert node_evidence.source_event_id == report_id(61)
    assert "above 80%" in node_evidence.detail
    assert "held 61s" in node_evidence.detail
    assert "hold 60s" in node_evidence.detail
    assert pool_evidence.metric == "pool_effective_utilization_pct"
    assert (pool_evidence.value, pool_evidence.range_low, pool_evidence.range_high) == (
        55.0, 20.0, 80.0)


def test_state_records_the_side() -> None:
    evaluation = load_balance.evaluate(node(0, util=5, **MOVABLE), ARGS, at(0), None, "analyzer")
    assert evaluation.state == ConditionState(since=at(0), detail="low")


@pytest.mark.parametrize("dry_run", [True, False])
def test_dry_run_is_copied_onto_the_need(dry_run: bool) -> None:
    [[], [need]] = timeline([(0, 90, 50, "up"), (61, 90, 50, "up")], dry_run=dry_run)
    assert need.dry_run is dry_run


def test_ids_are_deterministic_per_episode() -> None:
    points: list[Point] = [(0, 90, 50, "up"), (61, 90, 50, "up"), (70, 60, 50, "up"),
                           (80, 90, 50, "up"), (141, 90, 50, "up")]
    first = [n.event_id for needs in timeline(points) for n in needs]
    assert first == [n.event_id for needs in timeline(points) for n in needs]
    assert len(set(first)) == 2


@pytest.mark.parametrize(
    "fields",
    [{"pool_low": 90.0}, {"high_exit": 90.0}, {"hold_s": -1.0}, {"node_high": 80.0}],
)
def test_args_are_validated(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        load_balance.Args.model_validate(fields)


def test_default_args() -> None:
    assert load_balance.Args().model_dump() == {
        "low_enter": 20.0, "low_exit": 25.0, "high_enter": 80.0, "high_exit": 75.0,
        "hold_s": 60.0, "pool_low": 20.0, "pool_high": 80.0, "min_room_pct": 20.0,
    }


HOT: list[Point] = [(0, 90, 50, "up"), (61, 90, 50, "up")]
IDLE: list[Point] = [(0, 5, 50, "up"), (61, 5, 50, "up")]


def spread(lowest: Sequence[tuple[str, float]] = (),
           busy: Sequence[tuple[str, float]] = ()) -> PoolSpread:
    return PoolSpread(lowest=tuple(NodeLoad(node_id=n, load_pct=v) for n, v in lowest),
                      busiest_movable=tuple(NodeLoad(node_id=n, load_pct=v) for n, v in busy))


@pytest.mark.parametrize(
    ("points", "context", "expected"),
    [
        pytest.param(HOT, {"movable_jobs": 0, "pinned_jobs": 1}, [],
                     id="a hot node whose only job is gang, whole-node or do-not-disrupt"),
        pytest.param(HOT, {"movable_jobs": 0}, [], id="a hot node that reports no job"),
        pytest.param(HOT, {"spread": spread([("node-007", 90), ("node-002", 60)])}, [],
                     id="a hot node and no other node with room (60 % > 55 %)"),
        pytest.param(HOT, {"spread": spread([("node-002", 55), ("node-007", 90)])},
                     [(61, "load_balance")], id="room at exactly 55 %"),
        pytest.param(HOT, {"spread": spread([("node-007", 90)])}, [],
                     id="a hot node alone in its pool"),
        pytest.param(HOT, {"spread": None}, [], id="the pool's spread unknown"),
        pytest.param(IDLE, {"spread": spread([("node-007", 5)], [("node-003", 85)])},
                     [(61, "load_balance")], id="an idle node and a hot node with movable work"),
        pytest.param(IDLE, {"spread": spread([("node-007", 5)], [])}, [],
                     id="an idle node, hot nodes only with work that cannot move"),
        pytest.param(IDLE, {"spread": spread([("node-007", 5)], [("node-003", 70)])}, [],
                     id="an idle node, movable work only on nodes inside the range"),
        pytest.param(IDLE, {"spread": spread([("node-007", 5)], [("node-007", 95)])}, [],
                     id="the busiest movable node is the idle node itself (stale index)"),
    ],
)
def test_a_balance_need_only_where_moving_work_helps(
    points: list[Point], context: dict[str, Any], expected: list[tuple[float, str]]
) -> None:
    assert kinds(points, **context) == expected


def test_a_blocked_condition_restarts_its_hold_once_work_can_move() -> None:
    args = ARGS
    step = evaluate_with(args)
    blocked = step(node(0, util=90, movable_jobs=0, spread=SPREAD), None)
    assert blocked == Evaluation(None, [])
    first = step(node(30, util=90, **MOVABLE), blocked.state)
    assert first.needs == []
    assert first.state is not None
    assert first.state.since == at(30)
    assert step(node(61, util=90, **MOVABLE), first.state).needs == []
    assert len(step(node(91, util=90, **MOVABLE), first.state).needs) == 1


def test_the_need_names_the_other_end_of_the_move() -> None:
    [[], [hot]] = timeline(HOT)
    assert "2 movable job(s); node-002 at 30.0% has room" in hot.evidence[1].detail
    [[], [idle]] = timeline(IDLE)
    assert "node-003 at 90.0% has work that can move here" in idle.evidence[1].detail


def test_min_room_is_an_argument() -> None:
    tight = load_balance.Args(min_room_pct=50.0)  # room only below 25 %
    assert kinds(HOT, tight) == []
    assert kinds(HOT, tight, spread=spread([("node-002", 20)])) == [(61, "load_balance")]
