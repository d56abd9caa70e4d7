"""The state a need keeps between observations: hysteresis and "must hold for".

A condition enters when a value crosses the enter threshold and leaves only when it crosses
the (looser) exit threshold; a need is raised once the condition has held for its hold
period, once per episode. Needs are pure: they take the prior state and return the next.
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict

from schemas.events.v1 import OpsNeed


class ConditionState(BaseModel):
    """A condition in force for one (need, target): since when, and whether it was raised."""

    model_config = ConfigDict(frozen=True)

    since: datetime
    raised: bool = False
    detail: str = ""


class Evaluation(NamedTuple):
    """What a need decided: the condition's next state (None: not in force) and new needs."""

    state: ConditionState | None
    needs: list[OpsNeed]


def held_for(state: ConditionState | None, now: datetime) -> float:
    """Seconds a condition has been in force (0 if it is not)."""
    return (now - state.since).total_seconds() if state is not None else 0.0
