"""The planning loop's pure parts: the history lists read back, and the pool's node type."""

from __future__ import annotations

from datetime import UTC, datetime

from services.analyzer.planning import PlanningArgs, parse_series, pool_shape
from services.executor.planning import NodeView, PoolView


def node(name: str, gpus: int) -> NodeView:
    return NodeView(node_id=name, pool="gpu", state="up", mode="active", util_pct=50.0,
                    gpus=gpus, jobs=(), job_count=0)


def test_history_entries_come_back_oldest_first_and_bad_ones_are_skipped() -> None:
    entries = [b"7200:30.5", b"junk", b"3600:20.000"]
    assert parse_series(entries) == [(datetime.fromtimestamp(3600, UTC), 20.0),
                                     (datetime.fromtimestamp(7200, UTC), 30.5)]


def test_the_pool_grows_by_its_most_common_node() -> None:
    view = PoolView(cluster="c", pool="gpu",
                    nodes=(node("a", 8), node("b", 8), node("c", 4), node("d", 4)))
    shape = pool_shape(view)
    # A tie between 8 and 4 GPUs: the larger node.
    assert (shape.nodes_now, shape.gpus_now, shape.node_type.name) == (4, 24, "8gpu")
    assert pool_shape(view, "h100-8x").node_type.name == "h100-8x"
    empty = pool_shape(PoolView(cluster="c", pool="gpu", nodes=()))
    assert (empty.nodes_now, empty.gpus_now, empty.node_type.gpus) == (0, 0, 8)


def test_the_settings_carry_into_the_plan() -> None:
    settings = PlanningArgs(horizon_days=91, lead_time_days=14, basis="mean").plan_settings()
    assert (settings.horizon_days, settings.lead_time_days, settings.basis) == (91, 14, "mean")
