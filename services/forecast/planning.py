"""The capacity plan for procurement: a pool's daily peak utilisation weeks to months ahead,
when it leaves the range, and how many nodes of which type to add by when. Pure; no I/O.

One function per step, each usable (and tested) alone:

1. `daily_history`: the daily means, from the hourly history where it covers a day (at least
   `MIN_HOURS_A_DAY` hours) and from the daily history before that; gaps interpolated.
2. `peak_uplift`: how far the busiest hour of a day typically sits above the day's mean (the
   median over the last weeks of hourly history). Capacity has to hold the peak hour, while
   months of trend are read best from daily means, which are far less noisy.
3. `forecast_days`: the daily means ahead, with 80 % and 95 % intervals (ETS(A,Ad,N), after
   taking out the weekly cycle once there are `WEEKLY_MIN_DAYS` of history; the random walk
   on too short or constant a history); `services.forecast.model.fit_ahead` fits it.
4. `plan_days`: the daily peak ahead (forecast mean + uplift, with the intervals moved with
   it) and, per day, the nodes of the pool's node type that keep it at or below
   `high_exit` (as the executor's `add_capacity` counts them: utilisation is a share of
   today's capacity in GPUs).
5. `range_exits`: the first day the peak (or its 80 % upper bound) is above `high_enter`,
   and the first day its upper bound is below `low_enter`.
6. `procurement`: at each milestone, the nodes still to add so that every day up to it is
   covered on `basis` (the 80 % upper bound by default: a plan that is short one time in ten
   rather than one time in two), each to be ordered `lead_time_days` before it is needed.
   Never a removal: over-capacity is only reported (`below_range_at`).

`capacity_plan` runs the steps and returns the contract's `PoolPlan` (the body of the
`CapacityPlan` event). Deterministic: no random draws (ETS intervals are analytic).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final

import numpy as np

from schemas.events.v1 import PlanBasis, PlanDay, PoolPlan, ProcurementStep
from schemas.ranges import Band
from services.forecast.capacity import nodes_needed
from services.forecast.model import Fitted, FloatArray, fit_ahead

DAY: Final = timedelta(days=1)
# A day counts from the hourly history once half of it is there (a collector outage of a
# few hours does not lose the day); below that the daily history's mean is used, if any.
MIN_HOURS_A_DAY: Final = 12
# A day's peak is read only from a day with nearly all its hours (a missing afternoon would
# make the peak look lower than it was).
PEAK_HOURS_A_DAY: Final = 20
UPLIFT_DAYS: Final = 28
# ETS(A,Ad,N) has five parameters: two weeks of days is the least that pins them.
MIN_TREND_DAYS: Final = 14
# The weekly cycle is taken out once it can be seen three times (MSTL needs more than two).
WEEKLY_MIN_DAYS: Final = 21
DEFAULT_MILESTONES: Final = (28, 91, 182, 365)
MAX_HISTORY_DAYS: Final = 730


@dataclass(frozen=True)
class NodeType:
    """The node a pool grows by: a name (e.g. "8gpu") and its GPUs."""

    name: str
    gpus: int

    def __post_init__(self) -> None:
        if not 1 <= self.gpus <= 64:
            raise ValueError(f"a node has 1 to 64 GPUs, not {self.gpus}")


@dataclass(frozen=True)
class PoolShape:
    """The pool as it is: its up nodes, their GPUs, and the type of node added to it."""

    nodes_now: int
    gpus_now: int
    node_type: NodeType


@dataclass(frozen=True)
class PlanSettings:
    horizon_days: int = 182
    lead_time_days: int = 42
    milestones_days: tuple[int, ...] = DEFAULT_MILESTONES
    basis: PlanBasis = "upper_80"
    damped_trend: bool = True


@dataclass(frozen=True)
class DailyHistory:
    """Whole UTC days of history: the first day's midnight, the daily means (gaps filled),
    the daily peak hour where the hourly history has it (NaN elsewhere)."""

    start: datetime
    means: FloatArray
    peaks: FloatArray
    filled: int = 0

    @property
    def days(self) -> int:
        return int(self.means.size)


@dataclass(frozen=True)
class DayForecast:
    """The daily means ahead from `start`, one per day, with the model that made them."""

    start: datetime
    fitted: Fitted
    model: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RangeExits:
    above_mean: datetime | None = None
    above_upper_80: datetime | None = None
    below_upper_80: datetime | None = None


@dataclass
class _Buckets:
    sums: dict[int, float] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    peaks: dict[int, float] = field(default_factory=dict)


def floor_day(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def _bucket(series: Sequence[tuple[datetime, float]], start: datetime,
            end: datetime) -> _Buckets:
    buckets = _Buckets()
    for at, value in series:
        if at.tzinfo is None:
            raise ValueError(f"naive timestamp {at.isoformat()}: every time must be aware (UTC)")
        if not start <= at < end or not math.isfinite(value):
            continue
        day = (floor_day(at) - start) // DAY
        buckets.sums[day] = buckets.sums.get(day, 0.0) + float(value)
        buckets.counts[day] = buckets.counts.get(day, 0) + 1
        buckets.peaks[day] = max(buckets.peaks.get(day, -math.inf), float(value))
    return buckets


def daily_history(hourly: Sequence[tuple[datetime, float]],
                  daily: Sequence[tuple[datetime, float]], now: datetime,
                  max_days: int = MAX_HISTORY_DAYS) -> DailyHistory | None:
    """The means of the whole UTC days before the one containing `now`, oldest first.

    `hourly` holds hourly means (one per hour start), `daily` daily means (one per day
    start). A day with `MIN_HOURS_A_DAY` hourly values is their mean; otherwise the daily
    value, if any. Days with neither, between the first and the last, are interpolated.
    """
    end = floor_day(now)
    start = end - max_days * DAY
    hours = _bucket(hourly, start, end)
    days = _bucket(daily, start, end)
    means: dict[int, float] = {d: s / days.counts[d] for d, s in days.sums.items()}
    for d, s in hours.sums.items():
        if hours.counts[d] >= MIN_HOURS_A_DAY:
            means[d] = s / hours.counts[d]
    if not means:
        return None
    first, last = min(means), max(means)
    index = np.arange(first, last + 1, dtype=np.float64)
    known = sorted(means)
    values = np.interp(index, np.array(known, dtype=np.float64),
                       np.array([means[d] for d in known], dtype=np.float64))
    peaks = np.array([hours.peaks[d] if hours.counts.get(d, 0) >= PEAK_HOURS_A_DAY else math.nan
                      for d in range(first, last + 1)], dtype=np.float64)
    return DailyHistory(start + first * DAY, values.astype(np.float64), peaks,
                        int(index.size - len(known)))


def peak_uplift(history: DailyHistory, days: int = UPLIFT_DAYS) -> float | None:
    """The median, over the last `days` days whose peak is known, of peak minus mean (% points);
    None when no day has a known peak (no hourly history)."""
    gaps = [float(p - m) for p, m in zip(history.peaks[-days:], history.means[-days:],
                                         strict=True) if math.isfinite(p)]
    return max(statistics.median(gaps), 0.0) if gaps else None


def forecast_days(history: DailyHistory, steps: int, damped: bool = True) -> DayForecast:
    """The next `steps` daily means after the history (the first one is the day after it)."""
    if steps < 1:
        raise ValueError("steps must be at least 1")
    notes: list[str] = []
    weekly = history.days >= WEEKLY_MIN_DAYS
    periods = (7,) if weekly else ()
    fitted = fit_ahead(history.means, steps, periods, damped, notes, min_points=MIN_TREND_DAYS)
    naive = any("carried forward" in n for n in notes)
    trend = f"ETS(A,{'Ad' if damped else 'A'},N)"
    model = ("random walk on the daily means" if naive
             else f"MSTL(7d) + {trend} on the daily means" if weekly
             else f"{trend} on the daily means")
    return DayForecast(history.start + history.days * DAY, fitted, model, tuple(notes))


def plan_days(forecast: DayForecast, uplift: float, shape: PoolShape, band: Band,
              first_day: datetime, days: int) -> list[PlanDay]:
    """`days` days from `first_day`: the forecast peak and the nodes that hold it."""
    out: list[PlanDay] = []
    offset = (first_day - forecast.start) // DAY
    if offset < 0:
        raise ValueError("first_day is before the forecast starts")
    f = forecast.fitted
    for i in range(offset, offset + days):
        values = [max(float(c[i]) + uplift, 0.0)
                  for c in (f.mean, f.lower_80, f.upper_80, f.lower_95, f.upper_95)]
        mean, lo80, hi80, lo95, hi95 = (round(v, 4) for v in values)
        out.append(PlanDay(
            day=forecast.start + i * DAY, peak_pct=mean, lower_80=lo80, upper_80=hi80,
            lower_95=lo95, upper_95=hi95,
            nodes_mean=_nodes(mean, shape, band), nodes_upper_80=_nodes(hi80, shape, band)))
    return out


def _nodes(peak_pct: float, shape: PoolShape, band: Band) -> int:
    needed = nodes_needed(peak_pct, shape.nodes_now, float(shape.gpus_now),
                          float(shape.node_type.gpus), band.high_exit)
    # No capacity to read a share against: the pool keeps what it has.
    return shape.nodes_now if needed is None else needed


def range_exits(days: Sequence[PlanDay], band: Band) -> RangeExits:
    def first(test: str) -> datetime | None:
        for d in days:
            if ((test == "mean" and d.peak_pct > band.high_enter)
                    or (test == "upper" and d.upper_80 > band.high_enter)
                    or (test == "below" and d.upper_80 < band.low_enter)):
                return d.day
        return None

    return RangeExits(first("mean"), first("upper"), first("below"))


def procurement(days: Sequence[PlanDay], shape: PoolShape, settings: PlanSettings,
                now: datetime) -> list[ProcurementStep]:
    """The nodes to add by each milestone (days ahead) so that every day up to it has the
    nodes its `basis` peak needs; each step counts the pool as it is plus earlier steps."""
    have = shape.nodes_now
    steps: list[ProcurementStep] = []
    lead = settings.lead_time_days * DAY
    today = floor_day(now)
    for milestone in sorted(m for m in set(settings.milestones_days) if m >= 1):
        window = days[:milestone]
        needs = [d.nodes_mean if settings.basis == "mean" else d.nodes_upper_80
                 for d in window]
        if not needs or max(needs) <= have:
            continue
        first = next(d for d, n in zip(window, needs, strict=True) if n > have)
        nodes = max(needs) - have
        order_by = first.day - lead
        late = order_by < today
        gpus = nodes * shape.node_type.gpus
        steps.append(ProcurementStep(
            needed_by=first.day, order_by=max(order_by, today),
            node_type=shape.node_type.name, gpus_per_node=shape.node_type.gpus, nodes=nodes,
            gpus=gpus, basis=settings.basis, late=late,
            reason=(f"{shape.node_type.name} x{nodes} ({gpus} GPUs) by "
                    f"{first.day.date().isoformat()}: the {settings.basis} peak needs "
                    f"{max(needs)} nodes within {len(window)} days ({have} planned)"
                    + ("; the lead time has already run out: order now" if late else ""))))
        have = max(needs)
        if len(window) < milestone:
            break
    return steps


def capacity_plan(hourly: Sequence[tuple[datetime, float]],
                  daily: Sequence[tuple[datetime, float]], now: datetime, band: Band,
                  shape: PoolShape, settings: PlanSettings | None = None) -> PoolPlan:
    """The pool's plan from its hourly and daily utilisation history (%, aware times)."""
    settings = settings or PlanSettings()
    if now.tzinfo is None:
        raise ValueError("now must be aware (UTC)")
    now = now.astimezone(UTC)
    today = floor_day(now)
    base = PoolPlan(
        generated_at=now, horizon_days=settings.horizon_days, model="none", history_days=0,
        peak_uplift_pct=0.0, band=band.band(), nodes_now=shape.nodes_now,
        gpus_now=shape.gpus_now, node_type=shape.node_type.name,
        gpus_per_node=shape.node_type.gpus, lead_time_days=settings.lead_time_days)
    history = daily_history(hourly, daily, now)
    if history is None or history.days < 2:
        have = 0 if history is None else history.days
        return _with(base, history_days=have,
                     notes=[f"{have} whole days of history, 2 needed for a plan"])
    notes: list[str] = []
    if history.filled:
        notes.append(f"{history.filled} days without samples filled by interpolation")
    uplift = peak_uplift(history)
    if uplift is None:
        notes.append("no day with hourly history: the plan is of daily means, no peak uplift")
    steps = (today - history.start) // DAY - history.days + settings.horizon_days
    forecast = forecast_days(history, steps, settings.damped_trend)
    notes += [n[:256] for n in forecast.notes]
    days = plan_days(forecast, uplift or 0.0, shape, band, today, settings.horizon_days)
    exits = range_exits(days, band)
    return _with(
        base, model=forecast.model, history_days=history.days, history_from=history.start,
        peak_uplift_pct=round(uplift or 0.0, 4), leaves_range_at=exits.above_mean,
        leaves_range_at_upper_80=exits.above_upper_80, below_range_at=exits.below_upper_80,
        days=days, procurement=procurement(days, shape, settings, now), notes=notes[:16])


def _with(base: PoolPlan, **changes: object) -> PoolPlan:
    """`base` with `changes`, validated again (strictly, as on the wire)."""
    data = base.model_dump()
    data.update({k: [v.model_dump() if hasattr(v, "model_dump") else v for v in value]
                 if isinstance(value, list) else value for k, value in changes.items()})
    return PoolPlan.model_validate(data)
