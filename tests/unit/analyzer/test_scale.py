"""Table tests of the scale need: hysteresis, hold, one raise per episode, scale-in guards."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas.events.v1 import NodeStateName, OpsNeed
from services.analyzer.conditions import ConditionState, Evaluation
from services.analyzer.needs import scale
from services.analyzer.observation import PoolObservation
from tests.unit.analyzer.timeline import T0, Evaluator, at, pool, raised_at, run

ARGS = scale.Args()  # 20-80 %, exits 25/75 %, hold 60 s
Point = tuple[float, float, float]  # seconds after T0, gpu utilisation %, queued demand %


def evaluate_with(args: scale.Args, dry_run: bool = False) -> Evaluator[PoolObservation]:
    def step(obs: PoolObservation, prior: ConditionState | None) -> Evaluation:
        return scale.evaluate(obs, args, at(999), prior, "analyzer", dry_run)
    return step


def timeline(points: list[Point], states: dict[NodeStateName, int] | None = None,
             args: scale.Args = ARGS, dry_run: bool = False) -> list[list[OpsNeed]]:
    observations = [pool(t, util=u, demand=d, states=states) for t, u, d in points]
    return run(evaluate_with(args, dry_run), observations)


def kinds(points: list[Point], states: dict[NodeStateName, int] | None = None,
          args: scale.Args = ARGS) -> list[tuple[float, str]]:
    return raised_at(timeline(points, states, args), [t for t, _, _ in points])


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        pytest.param([(0, 85, 0), (30, 85, 0), (61, 85, 0)], [(61, "scale_out")],
                     id="held above the range raises scale-out once the hold is over"),
        pytest.param([(0, 90, 0), (10, 90, 0), (20, 50, 0), (80, 50, 0)], [],
                     id="a 10-second spike raises nothing"),
        pytest.param([(0, 85, 0), (59, 85, 0)], [], id="59 s is short of the hold"),
        pytest.param([(0, 85, 0), (61, 85, 0), (90, 85, 0), (300, 95, 0)], [(61, "scale_out")],
                     id="one raise per episode"),
        pytest.param([(0, 85, 0), (30, 77, 0), (61, 77, 0)], [(61, "scale_out")],
                     id="between exit and enter keeps the condition in force"),
        pytest.param([(0, 77, 0), (61, 77, 0), (200, 79, 0)], [],
                     id="between exit and enter never starts a condition"),
        pytest.param([(0, 80, 0), (61, 80, 0)], [], id="the enter threshold itself is in range"),
        pytest.param([(0, 85, 0), (30, 74, 0), (40, 85, 0), (99, 85, 0), (101, 85, 0)],
                     [(101, "scale_out")], id="leaving below the exit restarts the hold"),
        pytest.param([(0, 85, 0), (61, 85, 0), (70, 70, 0), (80, 85, 0), (141, 85, 0)],
                     [(61, "scale_out"), (141, "scale_out")],
                     id="exit then re-enter starts a new episode"),
        pytest.param([(0, 60, 30), (61, 60, 30)], [(61, "scale_out")],
                     id="queued demand counts: 60 % used + 30 % queued is over the range"),
        pytest.param([(0, 10, 0), (30, 10, 0), (61, 10, 0)], [(61, "scale_in")],
                     id="held below the range raises scale-in"),
        pytest.param([(0, 10, 0), (30, 23, 0), (61, 23, 0)], [(61, "scale_in")],
                     id="low side hysteresis: 23 % stays below the 25 % exit"),
        pytest.param([(0, 10, 0), (30, 26, 0), (61, 10, 0)], [],
                     id="low side exit above 25 % restarts the hold"),
        pytest.param([(0, 10, 5), (61, 10, 5), (200, 10, 5)], [],
                     id="no scale-in while demand is queued"),
        pytest.param([(0, 10, 0), (30, 10, 1), (61, 10, 0), (122, 10, 0)], [(122, "scale_in")],
                     id="queued demand ends the low episode; the hold starts again"),
        pytest.param([(0, 90, 0), (30, 10, 0), (61, 10, 0), (91, 10, 0)], [(91, "scale_in")],
                     id="from high straight to low: a new episode from the first low value"),
    ],
)
def test_scale_timeline(points: list[Point], expected: list[tuple[float, str]]) -> None:
    assert kinds(points) == expected


@pytest.mark.parametrize(
    "states",
    [
        pytest.param({"up": 3, "suspect": 1}, id="a suspect node"),
        pytest.param({"up": 3, "down": 1}, id="a down node"),
        pytest.param({"offline": 4}, id="no node up"),
    ],
)
def test_no_scale_in_while_the_pool_is_unhealthy(states: dict[NodeStateName, int]) -> None:
    assert kinds([(0, 5, 0), (61, 5, 0), (300, 5, 0)], states) == []


def test_scale_out_is_not_blocked_by_unhealthy_nodes() -> None:
    assert kinds([(0, 90, 0), (61, 90, 0)], {"up": 2, "down": 2}) == [(61, "scale_out")]


def test_state_records_the_side_and_whether_it_was_raised() -> None:
    first = scale.evaluate(pool(0, util=90), ARGS, at(0), None, "analyzer")
    assert first.state == ConditionState(since=at(0), raised=False, detail="high")
    second = scale.evaluate(pool(61, util=90), ARGS, at(61), first.state, "analyzer")
    assert second.state == ConditionState(since=at(0), raised=True, detail="high")
    low = scale.evaluate(pool(70, util=5), ARGS, at(70), second.state, "analyzer")
    assert low.state == ConditionState(since=at(70), raised=False, detail="low")
    assert scale.evaluate(pool(80, util=50), ARGS, at(80), low.state, "analyzer").state is None


def test_need_carries_full_evidence() -> None:
    [[], [need]] = timeline([(0, 70, 15), (61, 70, 15)])
    assert (need.kind, need.level, need.pool, need.target, need.subject) == (
        "scale_out", "cluster", "train", "train", "train")
    assert need.occurred_at == at(999)
    assert need.action_class is None
    [evidence] = need.evidence
    assert evidence.metric == "pool_effective_utilization_pct"
    assert (evidence.value, evidence.range_low, evidence.range_high) == (85.0, 20.0, 80.0)
    assert evidence.observed_at == at(61)
    assert "70.0% gpu + 15.0% demand" in evidence.detail
    assert "held 61s" in evidence.detail
    assert T0.isoformat() in evidence.detail
    assert "hold 60s" in evidence.detail


@pytest.mark.parametrize("dry_run", [True, False])
def test_dry_run_is_copied_onto_the_need(dry_run: bool) -> None:
    [[], [need]] = timeline([(0, 90, 0), (61, 90, 0)], dry_run=dry_run)
    assert need.dry_run is dry_run


def test_ids_are_deterministic_per_episode() -> None:
    points: list[Point] = [(0, 85, 0), (61, 85, 0), (70, 70, 0), (80, 85, 0), (141, 85, 0)]
    first = [n.event_id for needs in timeline(points) for n in needs]
    replay = [n.event_id for needs in timeline(points) for n in needs]
    assert first == replay
    assert len(set(first)) == 2  # two episodes, two events


def test_a_shorter_hold_is_an_argument() -> None:
    args = scale.Args(hold_s=5)
    assert kinds([(0, 90, 0), (5, 90, 0)], args=args) == [(5, "scale_out")]


@pytest.mark.parametrize(
    "fields",
    [
        {"low_exit": 15.0},  # exit inside the entry on the low side
        {"high_exit": 85.0},  # exit beyond the entry on the high side
        {"low_enter": 50.0, "low_exit": 80.0},  # the two sides overlap
        {"hold_s": -1.0},
        {"teleport": True},
    ],
)
def test_args_are_validated(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        scale.Args.model_validate(fields)


def test_default_args() -> None:
    assert scale.Args().model_dump() == {
        "low_enter": 20.0, "low_exit": 25.0, "high_enter": 80.0, "high_exit": 75.0,
        "hold_s": 60.0,
    }


def test_no_scale_in_while_work_is_queued_even_without_gpus() -> None:
    # Queued ops tasks count as items, not GPUs: capacity is not removed under them.
    step = evaluate_with(scale.Args())
    low = [pool(t, util=5.0).model_copy(update={"queued_items": 1,
                                                "queued_detail": "1 ops_tasks"})
           for t in (0, 61)]
    assert run(step, low) == [[], []]
    assert scale.scale_in_blocker(low[0]) == "0.0% demand queued (1 ops_tasks)"


def test_a_scale_out_driven_by_demand_names_what_is_queued() -> None:
    busy = [pool(t, util=50.0, demand=40.0).model_copy(update={
        "queued_items": 16, "queued_detail": "16 ml_tasks"}) for t in (0, 61)]
    [[], [need]] = run(evaluate_with(scale.Args()), busy)
    assert need.kind == "scale_out"
    assert "50.0% gpu + 40.0% demand (16 ml_tasks)" in need.evidence[0].detail
