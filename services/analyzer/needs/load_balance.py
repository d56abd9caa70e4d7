"""The load-balance need: one node out of its range while its pool, as a whole, is inside,
and only where moving work helps.

Like the descheduler's LowNodeUtilization rule, moving work needs both ends: a node above
the range with work that can move (not a gang piece, a whole-node job or a job flagged
do-not-disrupt) and another node with room to take it. A busy node with nothing movable, or
an idle node with nobody to take work from, is not an imbalance that moving work fixes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from pydantic import Field, model_validator

from schemas import ids
from schemas.envelope import short_text
from schemas.events.v1 import Evidence
from schemas.ranges import BandArgs, Side
from services.analyzer.conditions import ConditionState, Evaluation
from services.analyzer.needs.hysteresis import (
    advance,
    band_detail,
    band_side,
    episode_need,
    held_detail,
)
from services.analyzer.observation import NodeObservation, PoolSpread

NAME: Final = "load_balance"
LEVEL: Final = "node"


class Args(BandArgs):
    """The node's range (default 20-80 %, left at 25/75 %) and the pool range it applies in."""

    pool_low: float = Field(default=20.0, ge=0.0, le=1e6)
    pool_high: float = Field(default=80.0, ge=0.0, le=1e6)
    min_room_pct: float = Field(
        default=20.0, ge=0.0, le=100.0,
        description="A node has room for work when it is at least this far below the node "
                    "range's upper exit (default 75 - 20 = 55 %).")

    @model_validator(mode="after")
    def _pool_range_ordered(self) -> Args:
        if self.pool_low > self.pool_high:
            raise ValueError(f"need pool_low <= pool_high, got {self.pool_low}, {self.pool_high}")
        return self


def pool_in_range(obs: NodeObservation, args: Args) -> bool:
    """True when the pool's effective utilisation is known and inside its range."""
    pool = obs.pool_effective_utilization_pct
    # A pool out of its range is a scaling matter: moving work between nodes cannot fix it.
    return pool is not None and args.pool_low <= pool <= args.pool_high


def counterpart(obs: NodeObservation, side: Side, args: Args) -> tuple[str | None, str]:
    """(why moving work cannot help, None if it can; what the other end of the move is)."""
    spread = obs.spread or PoolSpread()
    if side == "high":
        if obs.movable_jobs == 0:
            pinned = (f" ({obs.pinned_jobs} gang, whole-node or do-not-disrupt)"
                      if obs.pinned_jobs else "")
            return f"no job on {obs.node_id} can move{pinned}", ""
        room = spread.least_loaded_other(obs.node_id)
        limit = args.high_exit - args.min_room_pct
        if room is None or room.load_pct > limit:
            return f"no other node is below {limit:g}% to take work", ""
        return None, (f"{obs.movable_jobs} movable job(s); {room.node_id} at "
                      f"{room.load_pct:.1f}% has room")
    busy = spread.busiest_movable_other(obs.node_id)
    if busy is None or busy.load_pct <= args.high_enter:
        return f"no node above {args.high_enter:g}% has a job that can move", ""
    return None, f"{busy.node_id} at {busy.load_pct:.1f}% has work that can move here"


def evaluate(
    obs: NodeObservation,
    args: Args,
    now: datetime,
    prior: ConditionState | None,
    source: str,
    dry_run: bool = False,
) -> Evaluation:
    """A node busier or idler than its range for `hold_s`, in a pool that is inside its own."""
    # Only a node in service can give or take work; any other state ends the episode.
    if obs.state != "up" or not pool_in_range(obs, args):
        return Evaluation(None, [])
    value = obs.load_pct
    side = band_side(prior.detail if prior else None, value, args)
    # Where moving work cannot help, the condition is not in force (its hold starts again
    # once it can); nothing is raised for it.
    blocked, other_end = counterpart(obs, side, args) if side is not None else (None, "")
    if blocked is not None:
        side = None
    state, raise_now = advance(prior, side, obs.observed_at, args.hold_s)
    if state is None or side is None or not raise_now:
        return Evaluation(state, [])
    pool_value = obs.pool_effective_utilization_pct or 0.0
    need = episode_need(
        ids.NEEDS_LOAD_BALANCE, cluster=obs.cluster_id, pool=obs.pool, target=obs.node_id,
        kind="load_balance", level=LEVEL, state=state, now=now, source=source, dry_run=dry_run,
        cause=obs.source_event_id,
        evidence=[
            Evidence(
                metric="node_load_pct" if obs.storage_weight else "node_gpu_utilization_pct",
                value=value,
                range_low=args.low_enter, range_high=args.high_enter,
                observed_at=obs.observed_at, source_event_id=obs.source_event_id,
                detail=short_text(f"{band_detail(side, value, args)}; "
                                  f"{held_detail(state, obs.observed_at, args.hold_s)}"),
            ),
            Evidence(
                metric="pool_effective_utilization_pct", value=pool_value,
                range_low=args.pool_low, range_high=args.pool_high,
                observed_at=obs.observed_at, source_event_id=obs.source_event_id,
                detail=short_text(f"pool {obs.pool} inside its range: balancing, not scaling; "
                                  f"{other_end}"),
            ),
        ],
    )
    return Evaluation(state, [need])
