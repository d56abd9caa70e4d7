"""The registry of ops needs: explicit, ordered by priority, one reason per entry.

Two call shapes. `detect` needs are stateless: `detect(obs, args, now, source)`. `evaluate`
needs keep a condition between observations (hysteresis, hold, one raise per episode):
`evaluate(obs, args, now, prior, source, dry_run) -> Evaluation`, and the caller stores the
returned state under (need, cluster, target). `level` says what they observe: a
NodeObservation ("node") or a PoolObservation ("cluster").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from schemas.events.v1 import OpsNeed
from services.analyzer.conditions import ConditionState, Evaluation
from services.analyzer.needs import load_balance, offline, online, restart_agent, scale
from services.analyzer.observation import NodeObservation

ObservedLevel = Literal["node", "cluster"]
Detect = Callable[[NodeObservation, Any, datetime, str], list[OpsNeed]]
# The observation is a NodeObservation or a PoolObservation, as `level` says.
Evaluate = Callable[[Any, Any, datetime, ConditionState | None, str, bool], Evaluation]


@dataclass(frozen=True)
class NeedModule:
    """One ops need: its name, what it observes, its argument model and its one entry point."""

    name: str
    level: ObservedLevel
    args: type[BaseModel]
    reason: str
    detect: Detect | None = None
    evaluate: Evaluate | None = None

    def __post_init__(self) -> None:
        if (self.detect is None) == (self.evaluate is None):
            raise ValueError(f"need {self.name}: exactly one of detect or evaluate")

    @property
    def stateful(self) -> bool:
        """True for `evaluate` needs, whose condition state the caller keeps."""
        return self.evaluate is not None


REGISTRY: tuple[NeedModule, ...] = (
    NeedModule(offline.NAME, offline.LEVEL, offline.Args,
               "first: a faulty node must leave service before anything counts on it",
               detect=offline.detect),
    NeedModule(restart_agent.NAME, restart_agent.LEVEL, restart_agent.Args,
               "a live node whose agent died needs its agent back, not to leave service",
               detect=restart_agent.detect),
    NeedModule(online.NAME, online.LEVEL, online.Args,
               "a repaired node back in service is capacity the needs below can use",
               evaluate=online.evaluate),
    NeedModule(load_balance.NAME, load_balance.LEVEL, load_balance.Args,
               "moving work inside a pool costs less than changing the pool's size",
               evaluate=load_balance.evaluate),
    NeedModule(scale.NAME, scale.LEVEL, scale.Args,
               "last: capacity changes are the slowest and most expensive remedy",
               evaluate=scale.evaluate),
)


def enabled(names: list[str]) -> list[NeedModule]:
    """The registered needs named in `names`, in registry order; an unknown name is an error."""
    known = {m.name for m in REGISTRY}
    if unknown := sorted(set(names) - known):
        raise ValueError(f"unknown needs {unknown}; known: {sorted(known)}")
    return [m for m in REGISTRY if m.name in names]
