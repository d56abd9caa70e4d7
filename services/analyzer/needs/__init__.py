"""The registry of ops needs: explicit, ordered by priority, one reason per entry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from schemas.events.v1 import OpsNeed
from services.analyzer.needs import offline
from services.analyzer.observation import NodeObservation

Detect = Callable[[NodeObservation, Any, datetime, str], list[OpsNeed]]


@dataclass(frozen=True)
class NeedModule:
    """One ops need: its name, argument model and detector."""

    name: str
    args: type[BaseModel]
    detect: Detect
    reason: str


REGISTRY: tuple[NeedModule, ...] = (
    # First: a faulty node must leave service before any balancing or scaling counts on it.
    NeedModule(offline.NAME, offline.Args, offline.detect,
               "fault data outside its range takes the node offline"),
)


def enabled(names: list[str]) -> list[NeedModule]:
    """The registered needs named in `names`, in registry order; an unknown name is an error."""
    known = {m.name for m in REGISTRY}
    if unknown := sorted(set(names) - known):
        raise ValueError(f"unknown needs {unknown}; known: {sorted(known)}")
    return [m for m in REGISTRY if m.name in names]
