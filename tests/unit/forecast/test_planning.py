"""The capacity plan: each step on data whose answer is exact by construction, and the whole
plan on a noisy trend with tolerances far above any BLAS kernel's rounding."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from uuid import UUID

import numpy as np
import pytest

from schemas.events.v1 import CapacityPlan, PlanDay
from schemas.ranges import Band
from services.forecast.model import Fitted
from services.forecast.planning import (
    DailyHistory,
    DayForecast,
    NodeType,
    PlanSettings,
    PoolShape,
    capacity_plan,
    daily_history,
    forecast_days,
    peak_uplift,
    plan_days,
    procurement,
    range_exits,
)

NOW = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
TODAY = datetime(2026, 3, 2, tzinfo=UTC)
DAY = timedelta(days=1)
HOUR = timedelta(hours=1)
BAND = Band()  # 20-80 %, left at 25/75 %
SHAPE = PoolShape(nodes_now=10, gpus_now=80, node_type=NodeType("8gpu", 8))


def hours_of(days: int, value: Callable[[int, int], float]) -> list[tuple[datetime, float]]:
    """`days` whole days of hourly values before TODAY; value(day, hour) -> %."""
    return [(TODAY - (days - d) * DAY + h * HOUR, float(value(d, h)))
            for d in range(days) for h in range(24)]


def fitted(means: list[float], spread: float = 0.0) -> Fitted:
    m = np.array(means, dtype=np.float64)
    return Fitted(m, m - spread, m + spread, m - 2 * spread, m + 2 * spread)


# ---------------------------------------------------------------- 1. daily history


def test_daily_means_come_from_hours_then_from_the_daily_history_before_them() -> None:
    # Hours of the last 3 days: 10 % at night (0-11 h), 30 % by day: mean 20 %, peak 30 %.
    hourly = hours_of(3, lambda d, h: 10 if h < 12 else 30)
    daily = [(TODAY - 5 * DAY, 4.0), (TODAY - 4 * DAY, 6.0), (TODAY - 3 * DAY, 99.0)]
    history = daily_history(hourly, daily, NOW)
    assert history is not None
    assert history.start == TODAY - 5 * DAY
    # The daily value of a day the hours cover (99) gives way to the hours' mean.
    assert history.means.tolist() == [4.0, 6.0, 20.0, 20.0, 20.0]
    assert np.isnan(history.peaks[:2]).all()
    assert history.peaks[2:].tolist() == [30.0] * 3
    assert history.filled == 0


def test_a_day_with_few_hours_falls_back_and_a_missing_day_is_interpolated() -> None:
    hourly = [(TODAY - 3 * DAY + h * HOUR, 50.0) for h in range(5)]  # 5 h: not a day
    daily = [(TODAY - 4 * DAY, 10.0), (TODAY - 2 * DAY, 30.0), (TODAY - DAY, 40.0)]
    history = daily_history(hourly, daily, NOW)
    assert history is not None
    assert history.means.tolist() == [10.0, 20.0, 30.0, 40.0]
    assert history.filled == 1
    # Today's hours are still filling: never part of the history.
    assert daily_history([(NOW - HOUR, 1.0)], [], NOW) is None


def test_a_naive_time_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        daily_history([(datetime(2026, 1, 1), 1.0)], [], NOW)  # noqa: DTZ001


# ---------------------------------------------------------------- 2. peak uplift


def test_the_uplift_is_the_median_peak_above_the_mean() -> None:
    # Mean m, peak m + gap: gaps 2, 4 and 10 -> median 4; the day without hours is skipped.
    history = DailyHistory(TODAY - 4 * DAY, np.array([50.0, 50.0, 40.0, 60.0]),
                           np.array([math.nan, 52.0, 44.0, 70.0]))
    assert peak_uplift(history) == 4.0
    assert peak_uplift(DailyHistory(TODAY, np.array([1.0]), np.array([math.nan]))) is None


# ---------------------------------------------------------------- 3. forecast of the days


def test_a_noisy_trend_is_extrapolated_within_its_intervals() -> None:
    # 60 days rising 0.5 points a day from 40 %, noise sigma 1: the next 28 days' means stay
    # within 3 points of the truth, and the intervals nest and widen.
    rng = random.Random(7)
    truth = [40.0 + 0.5 * d for d in range(88)]
    history = DailyHistory(TODAY - 60 * DAY,
                           np.array([v + rng.gauss(0, 1.0) for v in truth[:60]]),
                           np.full(60, math.nan))
    ahead = forecast_days(history, 28, damped=False)
    assert ahead.start == TODAY
    assert "ETS(A,A,N)" in ahead.model
    assert np.max(np.abs(ahead.fitted.mean - np.array(truth[60:]))) < 3.0
    f = ahead.fitted
    assert (f.lower_95 <= f.lower_80).all()
    assert (f.lower_80 <= f.mean).all()
    assert (f.mean <= f.upper_80).all()
    assert (f.upper_80 <= f.upper_95).all()
    assert f.upper_80[-1] - f.lower_80[-1] > f.upper_80[0] - f.lower_80[0]


def test_a_short_or_constant_history_is_carried_forward() -> None:
    flat = DailyHistory(TODAY - 30 * DAY, np.full(30, 42.0), np.full(30, math.nan))
    ahead = forecast_days(flat, 5)
    assert ahead.model == "random walk on the daily means"
    assert ahead.fitted.mean.tolist() == [42.0] * 5


# ---------------------------------------------------------------- 4-6. days, exits, orders


def planned(means: list[float], spread: float = 0.0) -> list[PlanDay]:
    forecast = DayForecast(TODAY, fitted(means, spread), "made")
    return plan_days(forecast, 5.0, SHAPE, BAND, TODAY, len(means))


def test_each_day_is_the_mean_plus_the_uplift_and_the_nodes_that_hold_it() -> None:
    days = planned([70.0, 85.0], spread=5.0)
    assert [d.day for d in days] == [TODAY, TODAY + DAY]
    assert (days[0].peak_pct, days[0].lower_80, days[0].upper_80) == (75.0, 70.0, 80.0)
    # 75 % of 80 GPUs at or below 75 %: 10 nodes; 80 % -> 64 GPUs / 0.75 = 85.3 -> 11 nodes.
    assert (days[0].nodes_mean, days[0].nodes_upper_80) == (10, 11)
    # 90 % -> 72 / 0.75 = 96 GPUs = 12 nodes exactly; 95 % -> 101.3 -> 13 nodes.
    assert (days[1].nodes_mean, days[1].nodes_upper_80) == (12, 13)


def test_the_range_is_left_first_by_the_upper_bound_then_by_the_mean() -> None:
    days = planned([60.0, 73.0, 76.0, 10.0], spread=5.0)  # peaks 65, 78, 81, 15
    exits = range_exits(days, BAND)
    assert exits.above_upper_80 == TODAY + DAY      # 83 > 80
    assert exits.above_mean == TODAY + 2 * DAY      # 81 > 80
    assert exits.below_upper_80 is None  # the last upper bound, 15 + 5, is not below 20
    assert range_exits(planned([10.0], spread=4.0), BAND).below_upper_80 == TODAY  # 19 < 20


def test_procurement_adds_per_milestone_ordered_a_lead_time_before() -> None:
    # The upper bound's nodes: 10 for 20 days, 12 from day 20, 14 from day 60.
    means = [65.0] * 20 + [85.0] * 40 + [100.0] * 40
    days = planned(means)  # peaks 70, 90, 105 -> 10, 12, 14 nodes
    settings = PlanSettings(horizon_days=100, lead_time_days=30, milestones_days=(28, 91))
    steps = procurement(days, SHAPE, settings, NOW)
    assert [(s.needed_by, s.order_by, s.nodes, s.gpus, s.late) for s in steps] == [
        (TODAY + 20 * DAY, TODAY, 2, 16, True),
        (TODAY + 60 * DAY, TODAY + 30 * DAY, 2, 16, False),
    ]
    assert steps[0].node_type == "8gpu"
    assert steps[0].basis == "upper_80"
    assert "order now" in steps[0].reason
    # Never a removal: a falling plan orders nothing.
    assert procurement(planned([10.0] * 30), SHAPE, settings, NOW) == []


# ---------------------------------------------------------------- the whole plan


def test_a_growing_pool_gets_a_plan_that_leaves_the_range_and_orders_nodes() -> None:
    # 90 days of hours: a daily mean rising 0.3 points a day from 45 %, the hour's value
    # +/- 6 points around it (a daily cycle), noise sigma 1.
    rng = random.Random(3)
    hourly = hours_of(90, lambda d, h: 45 + 0.3 * d + 6 * math.sin(2 * math.pi * h / 24)
                      + rng.gauss(0, 1.0))
    plan = capacity_plan(hourly, [], NOW, BAND, SHAPE,
                         PlanSettings(horizon_days=120, damped_trend=False))
    assert plan.history_days == 90
    assert plan.history_from == TODAY - 90 * DAY
    assert 4.5 < plan.peak_uplift_pct < 9.0  # the sine's peak, 6, plus the noise's maximum
    assert len(plan.days) == 120
    assert plan.days[0].day == TODAY
    # The truth's mean reaches 80 - 6 = 74 % (peak above 80) on day (74 - 45) / 0.3 ~ 97,
    # i.e. ~7 days after today: within a week either way.
    assert plan.leaves_range_at is not None
    assert abs((plan.leaves_range_at - (TODAY + 7 * DAY)) / DAY) <= 7
    assert plan.leaves_range_at_upper_80 is not None
    assert plan.leaves_range_at_upper_80 <= plan.leaves_range_at
    assert plan.procurement
    assert plan.procurement[0].node_type == "8gpu"
    assert sum(s.nodes for s in plan.procurement) >= 3
    event = CapacityPlan.model_validate_json(CapacityPlan(
        event_id=UUID(int=1), source="analyzer",
        occurred_at=NOW, cluster_id="c1", subject="gpu", pool="gpu", plan=plan,
    ).model_dump_json())
    assert event.plan == plan


def test_no_history_gives_an_empty_plan_that_says_why() -> None:
    plan = capacity_plan([], [], NOW, BAND, SHAPE)
    assert plan.model == "none"
    assert plan.days == []
    assert plan.procurement == []
    assert "0 whole days" in plan.notes[0]
