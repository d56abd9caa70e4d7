"""Pure planning of centre actions: guards, capacity plans, destinations and job moves."""

from __future__ import annotations

import pytest

from schemas.events.v1 import Guard
from schemas.ranges import Band
from services.capacity.provider import NodeOffer
from services.executor.planning import (
    JobRef,
    NodeView,
    PoolView,
    capacity_plan,
    evacuation_moves,
    guard_holds,
    nodes_to_remove,
    pick_destination,
    rebalance_moves,
    removal_order,
    standby_order,
)

DEFAULT = Band()  # 20-80 %, left at 25/75 %: the middle is 50 %
# A range whose middle is 70 %, as in "5 nodes at 85% -> 6 nodes at about 70%".
AROUND_70 = Band(low_enter=60.0, low_exit=62.0, high_exit=78.0, high_enter=80.0)


def job(job_id: str, state: str = "running") -> JobRef:
    return JobRef(job_id, "training", state)


def node(node_id: str, util: float, gpus: int = 4, jobs: int = 0, *, state: str = "up",
         mode: str = "active", pool: str = "default") -> NodeView:
    refs = tuple(job(f"{node_id}-j{i}") for i in range(jobs))
    return NodeView(node_id, pool, state, mode, util, gpus, refs, len(refs))


def pool_of(*nodes: NodeView, demand_pct: float = 0.0) -> PoolView:
    return PoolView("local", "default", tuple(nodes), {"up": len(nodes)}, demand_pct)


def uniform(count: int, util: float, gpus: int = 4, jobs: int = 1) -> PoolView:
    return pool_of(*(node(f"node-{i:03d}", util, gpus, jobs) for i in range(1, count + 1)))


def standby(*gpus: int) -> list[NodeOffer]:
    return standby_order(NodeOffer(f"standby-{i}", g) for i, g in enumerate(gpus, 1))


# ---------------------------------------------------------------- capacity


def test_five_nodes_at_85_add_one_to_six_at_about_70() -> None:
    plan = capacity_plan(uniform(5, 85.0), standby(4, 4, 4), AROUND_70, "out")
    assert plan.nodes == ("standby-1",)
    assert (plan.initial_nodes, plan.initial_util_pct) == (5, 85.0)
    assert plan.target_nodes == 6
    assert plan.target_util_pct == pytest.approx(70.8, abs=0.1)
    assert plan.reason == ("5 nodes at 85% -> add 1 node (4 GPUs, pool average 4) -> "
                           "6 nodes at about 71%")
    outputs = plan.outputs()
    assert outputs["initial_nodes"] == 5
    assert outputs["target_nodes"] == 6
    assert outputs["target_util_pct"] == 70.8
    assert outputs["nodes"] == "standby-1"


def test_target_can_be_set_instead_of_the_exit_threshold() -> None:
    plan = capacity_plan(uniform(5, 85.0), standby(*[4] * 6), DEFAULT, "out", target_pct=50.0)
    # 425 node-percent over 9 nodes is 47.2 %, nearer 50 than 8 nodes' 53.1 % (pure float
    # arithmetic: the 0.1 only covers quoting 47.22 to one decimal).
    assert plan.target_nodes == 9
    assert plan.target_util_pct == pytest.approx(47.2, abs=0.1)


def test_by_default_the_smallest_change_back_inside_the_range_is_made() -> None:
    # Out: aim at the high exit (75 %): 6 nodes at 70.8 %, not 9 at 47 %.
    out = capacity_plan(uniform(5, 85.0), standby(*[4] * 6), DEFAULT, "out")
    assert out.target_nodes == 6
    assert out.target_util_pct == pytest.approx(70.8, abs=0.1)
    assert "5 nodes at 85% -> add 1 node" in out.reason
    # In: aim at the low exit (25 %): 10 nodes at 15 % -> 6 nodes at 25 %.
    pool = uniform(10, 15.0)
    order = [NodeOffer(n.node_id, n.gpus) for n in removal_order(pool, [])]
    inward = capacity_plan(pool, order, DEFAULT, "in")
    assert inward.target_nodes == 6
    assert inward.target_util_pct == pytest.approx(25.0)


def test_a_bigger_standby_node_means_fewer_are_added_and_the_reason_says_so() -> None:
    pool = uniform(5, 95.0)  # 1,900 GPU-percent on 20 GPUs
    same_size = capacity_plan(pool, standby(4, 4, 4), AROUND_70, "out")
    bigger = capacity_plan(pool, standby(4, 8, 4), AROUND_70, "out")
    assert len(same_size.nodes) == 2
    assert same_size.target_util_pct == pytest.approx(67.9, abs=0.1)
    assert bigger.nodes == ("standby-2",)  # the 8-GPU node alone
    assert bigger.target_gpus == 28
    assert bigger.target_util_pct == pytest.approx(67.9, abs=0.1)
    assert "add 1 node (8 GPUs, pool average 4)" in bigger.reason
    assert "bigger standby nodes mean fewer added: 1 instead of 2" in bigger.reason
    assert "bigger" not in same_size.reason


def test_a_big_standby_node_that_would_overshoot_the_range_is_passed_over() -> None:
    pool = pool_of(node("a", 90.0, gpus=1), node("b", 90.0, gpus=1))
    plan = capacity_plan(pool, standby(8, 1), DEFAULT, "out")
    # 8 more GPUs would leave the pool at 18 %, below its range: one 1-GPU node gives 60 %.
    assert plan.nodes == ("standby-2",)
    assert plan.target_util_pct == pytest.approx(60.0)
    assert "smaller standby nodes" not in plan.reason


def test_weighted_by_gpus_not_by_nodes() -> None:
    # One 8-GPU node at 90 % and one 2-GPU node at 10 %: 740 of 1,000 GPU-percent, 74 %.
    pool = pool_of(node("big", 90.0, gpus=8), node("small", 10.0, gpus=2))
    assert pool.util_pct == pytest.approx(74.0)
    assert capacity_plan(pool, standby(4), DEFAULT, "out").nodes == ()


def test_queued_demand_and_incoming_jobs_count_as_work() -> None:
    pool = pool_of(*(node(f"n{i}", 60.0) for i in range(4)), demand_pct=25.0)
    assert pool.util_pct == pytest.approx(85.0)
    leaving = node("n9", 80.0, jobs=2, state="offline", mode="offline")
    with_jobs = uniform(4, 60.0).with_incoming(leaving)
    assert with_jobs.util_pct == pytest.approx(80.0)  # 960 + 320 GPU-percent on 16 GPUs
    assert uniform(4, 60.0).with_incoming(node("n0", 60.0, jobs=1)).incoming_load == 0.0


def test_a_pool_inside_its_range_is_left_alone() -> None:
    plan = capacity_plan(uniform(5, 70.0), standby(4), DEFAULT, "out")
    assert plan.nodes == ()
    assert "nothing to change" in plan.reason


def test_no_standby_capacity_adds_nothing_and_says_so() -> None:
    plan = capacity_plan(uniform(5, 95.0), [], DEFAULT, "out")
    assert plan.nodes == ()
    assert plan.target_nodes == 5
    assert plan.reason == "5 nodes at 95%: no standby capacity"


def test_not_enough_standby_capacity_adds_all_and_says_so() -> None:
    plan = capacity_plan(uniform(5, 100.0), standby(2), DEFAULT, "out")
    assert plan.nodes == ("standby-1",)
    assert "not enough standby capacity" in plan.reason


def test_fixed_count_takes_exactly_that_many() -> None:
    plan = capacity_plan(uniform(5, 70.0), standby(4, 4, 4), DEFAULT, "out", fixed_count=2)
    assert len(plan.nodes) == 2
    assert "fixed count" in plan.reason
    short = capacity_plan(uniform(5, 70.0), standby(4), DEFAULT, "out", fixed_count=3)
    assert len(short.nodes) == 1
    assert "asked for 3, 1 available" in short.reason


def test_scale_in_removes_towards_the_middle_and_never_the_last_node() -> None:
    pool = uniform(4, 10.0)  # 160 GPU-percent on 16 GPUs
    order = [NodeOffer(n.node_id, n.gpus) for n in removal_order(pool, [])]
    plan = capacity_plan(pool, order, DEFAULT, "in")
    assert len(plan.nodes) == 3  # one node at 40 %
    assert plan.target_nodes == 1
    assert plan.target_util_pct == pytest.approx(40.0)
    assert "remove 3 nodes" in plan.reason
    lonely = uniform(1, 5.0)
    order = [NodeOffer(n.node_id, n.gpus) for n in removal_order(lonely, [])]
    assert capacity_plan(lonely, order, DEFAULT, "in").nodes == ()


def test_removal_prefers_provider_nodes_then_fewest_jobs() -> None:
    pool = pool_of(node("a", 30.0, jobs=3), node("b", 30.0, jobs=1), node("c", 50.0, jobs=0),
                   node("standby-1", 40.0, jobs=2), node("d", 10.0, jobs=0, state="draining",
                                                          mode="draining"))
    assert nodes_to_remove(pool, ["standby-1"], 3) == ["standby-1", "c", "b"]
    assert nodes_to_remove(pool, [], 10) == ["c", "b", "standby-1", "a"]


# ---------------------------------------------------------------- guards


@pytest.mark.parametrize(
    ("guard", "pool", "expected", "words"),
    [
        ("pool_above_range", uniform(5, 85.0), True, "above 80%"),
        ("pool_above_range", uniform(5, 70.0), False, "not above 80%"),
        ("pool_below_range", uniform(5, 10.0), True, "below 20%"),
        ("pool_below_range", uniform(5, 30.0), False, "not below 20%"),
        ("nodes_out_of_range", pool_of(node("a", 90.0), node("b", 50.0)), True,
         "a at 90% above 80%"),
        ("nodes_out_of_range", pool_of(node("a", 50.0), node("b", 5.0)), True,
         "b at 5% below 20%"),
        ("nodes_out_of_range", pool_of(node("a", 50.0), node("b", 60.0)), False,
         "inside 20-80%"),
    ],
)
def test_pool_guards_each_way(guard: Guard, pool: PoolView, expected: bool, words: str) -> None:
    holds, reason = guard_holds(guard, pool, None, DEFAULT, DEFAULT)
    assert holds is expected
    assert words in reason


def test_pool_above_range_with_no_capacity_left_for_the_work() -> None:
    lone_leaving = node("n1", 70.0, jobs=2, state="offline", mode="offline")
    pool = pool_of().with_incoming(lone_leaving)
    assert guard_holds("pool_above_range", pool, None, DEFAULT, DEFAULT)[0] is True
    assert guard_holds("pool_above_range", pool_of(), None, DEFAULT, DEFAULT)[0] is False


def test_node_has_jobs_each_way() -> None:
    busy, idle = node("a", 50.0, jobs=2), node("b", 0.0)
    ending = NodeView("c", "default", "up", "active", 0.0, 4, (job("x", "stopped"),), 1)
    assert guard_holds("node_has_jobs", uniform(1, 50.0), busy, DEFAULT, DEFAULT) == (
        True, "a has 2 job(s) to move")
    assert guard_holds("node_has_jobs", uniform(1, 50.0), idle, DEFAULT, DEFAULT)[0] is False
    assert guard_holds("node_has_jobs", uniform(1, 50.0), ending, DEFAULT, DEFAULT)[0] is False
    # An offline node still owns the jobs its mode stopped: they must move.
    gone = NodeView("d", "default", "offline", "offline", 0.0, 4, (job("y", "stopped"),), 1)
    assert guard_holds("node_has_jobs", uniform(1, 50.0), gone, DEFAULT, DEFAULT) == (
        True, "d has 1 job(s) to move")
    assert guard_holds("node_has_jobs", uniform(1, 50.0), None, DEFAULT, DEFAULT) == (
        False, "node unknown")


# ---------------------------------------------------------------- destinations and moves


def test_destination_is_the_least_loaded_active_node_other_than_the_source() -> None:
    pool = pool_of(node("src", 5.0), node("busy", 60.0), node("calm", 30.0),
                   node("draining", 0.0, mode="draining"), node("suspect", 1.0, state="suspect"),
                   node("no-gpu", 0.0, gpus=0))
    chosen = pick_destination(pool, exclude=["src"])
    assert chosen is not None
    assert chosen.node_id == "calm"
    assert pick_destination(pool, exclude=["src", "calm", "busy"]) is None


def test_rebalance_moves_from_busy_to_idle_until_in_range() -> None:
    pool = pool_of(node("a", 95.0, jobs=3), node("b", 40.0, jobs=1), node("c", 10.0))
    moves = rebalance_moves(pool, DEFAULT, max_jobs=8)
    # a's jobs use a third of its 95 % each: one to c leaves a at 63 %, c at 42 %.
    assert [(m.job.job_id, m.src, m.dst) for m in moves] == [("a-j0", "a", "c")]


def test_rebalance_respects_max_jobs_and_never_overloads_the_receiver() -> None:
    pool = pool_of(node("a", 100.0, jobs=4), node("b", 100.0, jobs=4), node("c", 0.0),
                   node("d", 0.0))
    assert len(rebalance_moves(pool, DEFAULT, max_jobs=1)) == 1
    moves = rebalance_moves(pool, DEFAULT, max_jobs=8)
    assert {m.src for m in moves} == {"a", "b"}
    assert {m.dst for m in moves} <= {"c", "d"}
    assert len({m.job.job_id for m in moves}) == len(moves)
    full = pool_of(node("a", 100.0, jobs=1), node("b", 70.0, jobs=1))
    assert rebalance_moves(full, DEFAULT, max_jobs=8) == []  # b would end above 75 %


def test_an_idle_pool_is_not_shuffled() -> None:
    pool = pool_of(node("a", 15.0, jobs=2), node("b", 5.0, jobs=1), node("c", 0.0))
    assert rebalance_moves(pool, DEFAULT, max_jobs=8) == []


def test_a_small_idle_node_that_cannot_take_a_job_is_passed_for_a_bigger_one() -> None:
    # a's jobs are 360 GPU-percent each: the idle 1-GPU node would end at 360 %, the
    # 16-GPU node at 30 % ends at 52.5 %.
    pool = pool_of(node("a", 90.0, gpus=8, jobs=2), node("tiny", 0.0, gpus=1),
                   node("big", 40.0, gpus=8, jobs=1), node("mid", 30.0, gpus=16, jobs=1))
    moves = rebalance_moves(pool, DEFAULT, max_jobs=1)
    assert [(m.src, m.dst) for m in moves] == [("a", "mid")]


def test_rebalance_from_a_node_moves_out_of_a_busy_one_or_into_an_idle_one() -> None:
    pool = pool_of(node("a", 95.0, jobs=3), node("b", 50.0, jobs=2), node("c", 10.0, jobs=1))
    out = rebalance_moves(pool, DEFAULT, max_jobs=1, from_node="a")
    assert [(m.src, m.dst) for m in out] == [("a", "c")]
    into = rebalance_moves(pool, DEFAULT, max_jobs=1, from_node="c")
    assert [(m.src, m.dst) for m in into] == [("a", "c")]
    assert rebalance_moves(pool, DEFAULT, max_jobs=8, from_node="b") == []
    assert rebalance_moves(pool, DEFAULT, max_jobs=8, from_node="gone") == []


def test_evacuation_moves_every_owned_job_to_other_active_nodes() -> None:
    leaving = NodeView("x", "default", "offline", "offline", 50.0, 4,
                       (job("j1"), job("j2", "stopped"), job("j3", "failed")), 3)
    pool = pool_of(node("b", 40.0), node("c", 10.0), node("d", 0.0, mode="draining"))
    moves, unplaced = evacuation_moves(pool, leaving, max_jobs=64)
    assert unplaced == 0
    # The offline mode stopped j2, which still belongs here; j3 failed on its own and stays.
    assert [m.job.job_id for m in moves] == ["j1", "j2"]
    assert {m.src for m in moves} == {"x"}
    assert {m.dst for m in moves} <= {"b", "c"}
    nowhere, unplaced = evacuation_moves(pool_of(), leaving, max_jobs=64)
    assert (nowhere, unplaced) == ([], 2)
