"""The scale need: a pool's effective utilisation (usage plus queued demand) out of its range."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Final

from schemas import ids
from schemas.envelope import short_text
from schemas.events.v1 import Evidence, NeedKind
from schemas.ranges import BandArgs, Side
from services.analyzer.conditions import ConditionState, Evaluation
from services.analyzer.needs.hysteresis import (
    advance,
    band_detail,
    band_side,
    episode_need,
    held_detail,
)
from services.analyzer.observation import PoolObservation

NAME: Final = "scale"
LEVEL: Final = "cluster"
_KIND: Final[Mapping[Side, NeedKind]] = MappingProxyType({"high": "scale_out", "low": "scale_in"})


class Args(BandArgs):
    """The pool's range (default 20-80 %, left at 25/75 %) and how long it must be out of it."""


def scale_in_blocker(obs: PoolObservation) -> str | None:
    """Why removing capacity is unsafe now (None: it is safe)."""
    if obs.demand_pct > 0.0 or obs.queued_items > 0:
        # Queued work would need the capacity that scaling in removes.
        return f"{obs.demand_pct:.1f}% demand queued ({obs.queued_detail or 'work queued'})"
    unhealthy = obs.nodes_by_state.get("suspect", 0) + obs.nodes_by_state.get("down", 0)
    if unhealthy:
        # The low figure may be low because nodes are failing, not because work is scarce.
        return f"{unhealthy} nodes suspect or down"
    if obs.nodes_up == 0:
        return "no node is up"
    return None


def evaluate(
    obs: PoolObservation,
    args: Args,
    now: datetime,
    prior: ConditionState | None,
    source: str,
    dry_run: bool = False,
) -> Evaluation:
    """Scale out above the range, scale in below it, once the pool has stayed there `hold_s`."""
    value = obs.effective_utilization_pct
    # A blocked scale-in ends the low condition, so its hold restarts once it is safe again.
    side = band_side(prior.detail if prior else None, value, args,
                     allow_low=scale_in_blocker(obs) is None)
    state, raise_now = advance(prior, side, obs.observed_at, args.hold_s)
    if state is None or side is None or not raise_now:
        return Evaluation(state, [])
    kind = _KIND[side]
    queued = f" ({obs.queued_detail})" if obs.queued_detail else ""
    detail = (f"{band_detail(side, value, args)}; {obs.gpu_utilization_pct:.1f}% gpu + "
              f"{obs.demand_pct:.1f}% demand{queued}, {obs.nodes_up} nodes up; "
              f"{held_detail(state, obs.observed_at, args.hold_s)}")
    need = episode_need(
        ids.NEEDS_SCALE, cluster=obs.cluster_id, pool=obs.pool, target=obs.pool, kind=kind,
        level=LEVEL, state=state, now=now, source=source, dry_run=dry_run,
        evidence=[
            Evidence(
                metric="pool_effective_utilization_pct", value=value,
                range_low=args.low_enter, range_high=args.high_enter,
                observed_at=obs.observed_at, detail=short_text(detail),
            )
        ],
    )
    return Evaluation(state, [need])
