"""The capacity report: when a forecast leaves the scale need's range, how many nodes its
peak needs, and a shadow scale-out proposal. Pure; nothing here acts.

Nodes are counted as the executor's `add_capacity` counts them: utilisation is a share of
the pool's capacity (GPUs), and a change aims at the range's exit threshold on the side the
pool left (`high_exit`, 75 % by default), the smallest change back inside the range.

A proposal is shadow-only: it says "scale out by k before T" so that it can be recorded and
later compared with what the reactive scale need did; nothing executes it. There is never a
scale-in on a forecast (as AWS predictive scaling, which never scales in on its forecast):
a forecast that misses a burst after capacity was removed costs queued work, while one that
misses a dip costs only idle nodes until the measured scale need removes them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.ranges import BandArgs, Side
from services.forecast.model import Forecast, ForecastPoint, ModelKind

Basis = Literal["mean", "upper_80", "upper_95"]

DEFAULT_LEAD_TIME: Final = timedelta(minutes=15)
SCALE_IN_RULE: Final = (
    "no scale-in on a forecast: a missed burst after removing capacity costs queued work, a "
    "missed dip only idle nodes; scale-in waits for the measured scale need (its hysteresis, "
    "hold, queued-demand and node-health checks)"
)


class RangeExit(BaseModel):
    """The first forecast hour whose `basis` value is outside the range on `side`."""

    model_config = ConfigDict(frozen=True)

    at: datetime
    side: Side
    value: float
    basis: Basis | Literal["lower_80"]


class Peak(BaseModel):
    """The highest forecast hour of a window, by `basis`."""

    model_config = ConfigDict(frozen=True)

    at: datetime
    value: float
    basis: Basis


class CapacityWindow(BaseModel):
    """What the forecast says over the next `horizon`."""

    model_config = ConfigDict(frozen=True)

    horizon: timedelta
    hours: int
    peak_mean: Peak | None = None
    peak_upper_80: Peak | None = None
    first_above_mean: RangeExit | None = Field(
        default=None, description="First hour the mean is above the range (high_enter).")
    first_below_mean: RangeExit | None = Field(
        default=None, description="First hour the mean is below the range (low_enter).")
    first_above_upper_80: RangeExit | None = Field(
        default=None, description="First hour the 80 % upper bound is above the range.")
    nodes_needed_mean: int | None = Field(
        default=None, description="Nodes that keep the mean's peak at or below high_exit.")
    nodes_needed_upper_80: int | None = Field(
        default=None, description="Nodes that keep the 80 % upper bound's peak at or below "
                                  "high_exit.")


class ShadowProposal(BaseModel):
    """Scale out by `nodes` before `before`: recorded, never acted on."""

    model_config = ConfigDict(frozen=True)

    action: Literal["scale_out"] = "scale_out"
    shadow: Literal[True] = True
    nodes: int = Field(ge=1)
    before: datetime
    leaves_range_at: datetime
    peak_at: datetime
    peak_pct: float
    basis: Basis
    nodes_now: int
    nodes_after: int
    peak_after_pct: float = Field(description="The peak as a share of the larger pool.")
    reason: str


class CapacityReport(BaseModel):
    """The forecast read against the range: windows, a shadow scale-out, never a scale-in."""

    model_config = ConfigDict(frozen=True)

    generated_at: datetime
    model: ModelKind
    band: BandArgs
    nodes_now: int
    per_node_capacity: float
    capacity_now: float
    windows: tuple[CapacityWindow, ...] = ()
    proposal: ShadowProposal | None = None
    proposal_reason: str
    scale_in: None = Field(default=None, description="Always none: see scale_in_reason.")
    scale_in_reason: str = SCALE_IN_RULE


def nodes_needed(peak_pct: float, nodes_now: int, capacity_now: float,
                 per_node_capacity: float, target_pct: float) -> int | None:
    """Nodes that keep a load of `peak_pct` % of today's capacity at or below `target_pct`,
    adding (or, for this count only, removing) nodes of `per_node_capacity` each.

    None when there is no capacity now to read the percentage against.
    """
    if capacity_now <= 0 or target_pct <= 0:
        return None
    load = max(peak_pct, 0.0) / 100.0 * capacity_now
    required = load / (target_pct / 100.0)
    # Rounded before ceil so that float dust (4.0000000001 nodes) does not add a node.
    change = math.ceil(round((required - capacity_now) / per_node_capacity, 9))
    return max(nodes_now + change, 1 if load > 0 else 0)


def _first(points: Sequence[ForecastPoint], basis: Basis | Literal["lower_80"], side: Side,
           band: BandArgs) -> RangeExit | None:
    for p in points:
        value: float = getattr(p, basis)
        if (value > band.high_enter) if side == "high" else (value < band.low_enter):
            return RangeExit(at=p.at, side=side, value=value, basis=basis)
    return None


def _peak(points: Sequence[ForecastPoint], basis: Basis) -> Peak | None:
    if not points:
        return None
    # The earliest of equal peaks: the one to be ready for.
    best = max(points, key=lambda p: (getattr(p, basis), -p.at.timestamp()))
    return Peak(at=best.at, value=getattr(best, basis), basis=basis)


def _window(points: Sequence[ForecastPoint], horizon: timedelta, band: BandArgs,
            nodes_now: int, capacity_now: float, per_node: float) -> CapacityWindow:
    peak_mean, peak_upper = _peak(points, "mean"), _peak(points, "upper_80")

    def needed(peak: Peak | None) -> int | None:
        if peak is None:
            return None
        return nodes_needed(peak.value, nodes_now, capacity_now, per_node, band.high_exit)

    return CapacityWindow(
        horizon=horizon, hours=len(points), peak_mean=peak_mean, peak_upper_80=peak_upper,
        first_above_mean=_first(points, "mean", "high", band),
        first_below_mean=_first(points, "mean", "low", band),
        first_above_upper_80=_first(points, "upper_80", "high", band),
        nodes_needed_mean=needed(peak_mean), nodes_needed_upper_80=needed(peak_upper),
    )


def capacity_report(
    forecast: Forecast,
    band: BandArgs,
    nodes_now: int,
    per_node_capacity: float = 1.0,
    *,
    capacity_now: float | None = None,
    proposal_horizon: timedelta | None = None,
    lead_time: timedelta = DEFAULT_LEAD_TIME,
    basis: Basis = "mean",
) -> CapacityReport:
    """Read `forecast` (utilisation %, of the pool as it is now) against `band`.

    `nodes_now` nodes hold `capacity_now` (default `nodes_now * per_node_capacity`, e.g. in
    GPUs); a node added holds `per_node_capacity`. One window per forecast horizon. The
    shadow proposal looks `proposal_horizon` ahead (default: the shortest horizon, a day:
    further out the interval is too wide to act on even in shadow); if the `basis` series
    goes above `band.high_enter` there, it proposes the nodes its peak needs to stay at or
    below `band.high_exit`, `lead_time` before the hour it leaves the range.
    """
    if nodes_now < 0:
        raise ValueError("nodes_now must be >= 0")
    if per_node_capacity <= 0:
        raise ValueError("per_node_capacity must be > 0")
    capacity = nodes_now * per_node_capacity if capacity_now is None else capacity_now
    if capacity < 0:
        raise ValueError("capacity_now must be >= 0")
    if lead_time < timedelta(0):
        raise ValueError("lead_time must be >= 0")
    windows = tuple(
        _window(forecast.within(h), h, band, nodes_now, capacity, per_node_capacity)
        for h in forecast.horizons
    )
    proposal, reason = _propose(forecast, band, nodes_now, capacity, per_node_capacity,
                                proposal_horizon or min(forecast.horizons), lead_time, basis)
    scale_in_reason = SCALE_IN_RULE
    low = next((w.first_below_mean for w in windows if w.first_below_mean), None)
    if low is not None:
        scale_in_reason = (f"the forecast mean falls below {band.low_enter:g}% at "
                           f"{low.at.isoformat()} ({low.value:.1f}%), but {SCALE_IN_RULE}")
    return CapacityReport(
        generated_at=forecast.generated_at, model=forecast.model,
        # As a plain BandArgs (the scale need's Args subclasses it): the report reads back
        # from its JSON as it was made.
        band=BandArgs.model_validate(band.model_dump()),
        nodes_now=nodes_now, per_node_capacity=per_node_capacity, capacity_now=capacity,
        windows=windows, proposal=proposal, proposal_reason=reason,
        scale_in_reason=scale_in_reason,
    )


def _propose(forecast: Forecast, band: BandArgs, nodes_now: int, capacity: float,
             per_node: float, horizon: timedelta, lead_time: timedelta,
             basis: Basis) -> tuple[ShadowProposal | None, str]:
    points = forecast.within(horizon)
    if forecast.model == "none" or not points:
        return None, "no forecast to propose from"
    exit_ = _first(points, basis, "high", band)
    if exit_ is None:
        return None, (f"the forecast {basis} stays at or below {band.high_enter:g}% for the "
                      f"next {_hours(horizon)}: no scale-out")
    peak = _peak(points, basis)
    needed = (None if peak is None
              else nodes_needed(peak.value, nodes_now, capacity, per_node, band.high_exit))
    if peak is None or needed is None:
        return None, "no capacity now to read the forecast's percentage against"
    k = needed - nodes_now
    if k <= 0:  # only with a high_exit above high_enter, which BandArgs forbids
        return None, f"{nodes_now} nodes already keep the peak within the range"
    now = forecast.generated_at
    before = max(now, exit_.at - lead_time)
    after_pct = peak.value * capacity / (capacity + k * per_node)
    reason = (f"forecast {basis} leaves the range at {exit_.at.isoformat()} "
              f"({exit_.value:.1f}% > {band.high_enter:g}%), peak {peak.value:.1f}% at "
              f"{peak.at.isoformat()}: {nodes_now} -> {needed} nodes keeps it at about "
              f"{after_pct:.0f}% (<= {band.high_exit:g}%); scale out by {k} before "
              f"{before.isoformat()} ({forecast.model} model; shadow: recorded, not acted on)")
    if exit_.at <= now:
        reason += ("; the current hour is already forecast above the range, so the measured "
                   "scale need is the one that acts")
    proposal = ShadowProposal(
        nodes=k, before=before, leaves_range_at=exit_.at, peak_at=peak.at,
        peak_pct=peak.value, basis=basis, nodes_now=nodes_now, nodes_after=needed,
        peak_after_pct=round(after_pct, 3), reason=reason[:1000],
    )
    return proposal, reason


def _hours(span: timedelta) -> str:
    hours = span / timedelta(hours=1)
    return f"{hours:g} h"
