"""Shared by the stateful needs: which side of a band a value is on (the band and its hold,
`BandArgs`, live in schemas/ranges.py), conditions that must hold, episodes and their ids."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID, uuid5

from schemas.events.v1 import Evidence, NeedKind, NeedLevel, OpsNeed
from schemas.ranges import Band, Side
from services.analyzer.conditions import ConditionState, held_for


def band_side(
    prior: str | None, value: float, band: Band, *, allow_low: bool = True
) -> Side | None:
    """The side of the band `value` is on, given the side it was on: exits are looser."""
    if prior == "high" and value >= band.high_exit:
        return "high"
    if prior == "low" and allow_low and value <= band.low_exit:
        return "low"
    if value > band.high_enter:
        return "high"
    if allow_low and value < band.low_enter:
        return "low"
    return None


def advance(
    prior: ConditionState | None, in_force: str | None, at: datetime, hold_s: float
) -> tuple[ConditionState | None, bool]:
    """The condition's next state and whether to raise now (once per episode, after the hold).

    `in_force` names the condition that holds at `at` (None: none does). The same name as
    before continues the episode; a different one ends it and starts another.
    """
    if in_force is None:
        return None, False
    state = (
        prior if prior is not None and prior.detail == in_force
        else ConditionState(since=at, detail=in_force)
    )
    if not state.raised and held_for(state, at) >= hold_s:
        return state.model_copy(update={"raised": True}), True
    return state, False


def episode_need(
    namespace: UUID, *, cluster: str, pool: str, target: str, kind: NeedKind, level: NeedLevel,
    state: ConditionState, now: datetime, source: str, evidence: list[Evidence],
    dry_run: bool, cause: UUID | None = None,
) -> OpsNeed:
    """The need an episode raises, identified by the episode (same episode, same event id)."""
    return OpsNeed(
        event_id=episode_id(namespace, cluster, pool, target, kind, state.since),
        source=source,
        occurred_at=now,
        cluster_id=cluster,
        subject=target,
        correlation_id=str(cause) if cause is not None else None,
        kind=kind,
        level=level,
        pool=pool,
        target=target,
        evidence=evidence,
        dry_run=dry_run,
    )


def episode_id(
    namespace: UUID, cluster: str, pool: str, target: str, kind: str, since: datetime
) -> UUID:
    """A need's id from its episode: replaying the same observations raises the same event."""
    return uuid5(namespace, f"{cluster}/{pool}/{target}/{kind}/{since.isoformat()}")


def held_detail(state: ConditionState, at: datetime, hold_s: float) -> str:
    """How long a condition held, over which window, against which hold."""
    return (f"held {held_for(state, at):.0f}s from {state.since.isoformat()} "
            f"to {at.isoformat()} (hold {hold_s:.0f}s)")


def band_detail(side: Side, value: float, band: Band) -> str:
    """Which edge of the band a value crossed, and where it would leave the condition."""
    if side == "high":
        return f"{value:.1f}% above {band.high_enter:g}% (leaves below {band.high_exit:g}%)"
    return f"{value:.1f}% below {band.low_enter:g}% (leaves above {band.low_exit:g}%)"
