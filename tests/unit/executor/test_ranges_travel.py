"""The ranges a need was raised under travel with it to the executor's guards.

Before, the executor read the ranges from its own ANALYZER_* environment: an operator who set
a range on the analyzer only left the executor's guards on the defaults. Now the analyzer puts
its ranges on the need, the templater copies them onto the task (and the centre onto its
children), and the executor's guards read them from the task.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from schemas.events.v1 import OpsNeed, OpsTask
from schemas.ranges import DEFAULT_RANGES, Band, Ranges
from services.analyzer.handlers import Analyzer
from services.analyzer.needs.load_balance import Args as LoadBalanceArgs
from services.analyzer.needs.scale import Args as ScaleArgs
from services.analyzer.settings import AnalyzerSettings
from services.executor.planning import NodeView, PoolView, guard_holds
from services.shared.redis_client import Keys
from services.templater.templates import load_templates, plan
from tests.contracts.examples import example

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
# An operator's pool range of 40-60 % (left at 45/55 %), hold 30 s; node range 10-90 %.
OPERATOR = AnalyzerSettings(
    scale=ScaleArgs(low_enter=40.0, low_exit=45.0, high_exit=55.0, high_enter=60.0, hold_s=30.0),
    load_balance=LoadBalanceArgs(low_enter=10.0, low_exit=15.0, high_exit=85.0,
                                 high_enter=90.0),
)


def pool_at(util: float) -> PoolView:
    nodes = tuple(NodeView(f"node-{i}", "default", "up", "active", util, 4, (), 0)
                  for i in range(1, 4))
    return PoolView("local", "default", nodes, {"up": len(nodes)}, 0.0)


class _Outbox:
    async def delivered(self, event_ids: object) -> None:
        return None


class _Store:
    outbox = _Outbox()

    async def open_needs(self, needs: list[OpsNeed], ttl_s: int, now: object,
                         traces: object = None) -> list[OpsNeed]:
        return needs


class _Bus:
    def __init__(self) -> None:
        self.published: list[Any] = []

    async def publish_many(self, topic: object, events: list[Any]) -> None:
        self.published += events


async def raised(settings: AnalyzerSettings, need: OpsNeed) -> OpsNeed:
    """The need as the analyzer publishes it."""
    bus = _Bus()
    analyzer = Analyzer(settings, [], _Store(), None, bus, Keys("t:"))  # type: ignore[arg-type]
    await analyzer.publish([need])
    published: OpsNeed = bus.published[0]
    return published


def test_the_analyzer_settings_give_the_ranges_without_the_holds() -> None:
    ranges = OPERATOR.ranges_for("local", "default")
    assert ranges == Ranges(
        pool=Band(low_enter=40.0, low_exit=45.0, high_exit=55.0, high_enter=60.0),
        node=Band(low_enter=10.0, low_exit=15.0, high_exit=85.0, high_enter=90.0))
    assert type(ranges.pool) is Band  # the thresholds only: no hold_s on the wire
    assert AnalyzerSettings().ranges_for("local", "default") == DEFAULT_RANGES
    # A pool's override is what its needs carry.
    pool_only = AnalyzerSettings(overrides={"local/gpu": {"scale": {"high_enter": 90.0}}})
    assert pool_only.ranges_for("local", "gpu").pool.high_enter == 90.0
    assert pool_only.ranges_for("local", "default").pool.high_enter == 80.0


async def test_a_non_default_analyzer_range_reaches_the_executor_guard() -> None:
    base = example("ops_need", OpsNeed).model_copy(
        update={"kind": "scale_out", "target": "default", "ranges": None})
    need = await raised(OPERATOR, base)
    assert need.ranges == OPERATOR.ranges_for("local", "default")
    task = plan(load_templates()["scale_out"], need, NOW, "templater")
    # Across the wire, as the executor receives it.
    task = OpsTask.model_validate_json(task.model_dump_json())
    assert task.ranges == need.ranges
    ranges = task.ranges_in_force
    # The pool at 65 %: above the operator's 60 %, inside the default 20-80 %.
    holds, reason = guard_holds("pool_above_range", pool_at(65.0), None, ranges.pool,
                                ranges.node)
    assert (holds, reason) == (True, "pool default at 65.0% (3 nodes up) above 60%")
    default = DEFAULT_RANGES.pool
    assert guard_holds("pool_above_range", pool_at(65.0), None, default, default)[0] is False
    # Nodes at 85 %: inside the operator's 10-90 % node range, outside the default.
    assert guard_holds("nodes_out_of_range", pool_at(85.0), None, ranges.pool,
                       ranges.node)[0] is False


async def test_a_task_without_ranges_falls_back_to_the_documented_defaults() -> None:
    # A need from an older analyzer carries none; its task checks the defaults.
    old = example("ops_need", OpsNeed).model_copy(
        update={"kind": "scale_out", "target": "default", "ranges": None})
    task = plan(load_templates()["scale_out"], old, NOW, "templater")
    assert task.ranges is None
    assert task.ranges_in_force == DEFAULT_RANGES
    ranges = task.ranges_in_force
    assert guard_holds("pool_above_range", pool_at(85.0), None, ranges.pool, ranges.node) == (
        True, "pool default at 85.0% (3 nodes up) above 80%")
