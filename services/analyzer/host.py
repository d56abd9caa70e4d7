"""Host metrics as fault data: a full disk or memory pressure, range-checked like GPU faults.

The agent reports its host's CPU, memory, disk and network (HostMetrics); the collector
keeps them in each sample. A disk or memory above its range is a fault the analyzer adds to
the node's faults (kind `disk_full` or `memory_pressure`, class `drain`): like any counted
fault it makes a run of faulty reports, and the offline need takes the node out once the run
is long enough. Host pressure comes and goes (a log burst, a cache), so it must last longer
than a GPU fault: `min_consecutive_reports` of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from schemas.events.v1 import Fault, FaultKind

HOST_FAULT_KINDS: Final[frozenset[FaultKind]] = frozenset({"disk_full", "memory_pressure"})


class HostArgs(BaseModel):
    """The ranges of the host's fault data and how long they must be left."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    disk_max_pct: float = Field(
        default=95.0, ge=0.0, le=100.0, description="A disk fuller than this is a fault.")
    memory_max_pct: float = Field(
        default=95.0, ge=0.0, le=100.0, description="Host memory above this is a fault.")
    min_consecutive_reports: int = Field(
        default=6, ge=1, le=1_000,
        description="Reports in a row with host faults only before the node goes offline "
                    "(30 s at the agents' default 5 s interval).")


def host_faults(disk_used_pct: float, memory_pct: float, args: HostArgs) -> list[Fault]:
    """The host's metrics out of their range, as faults."""
    faults = []
    if disk_used_pct > args.disk_max_pct:
        faults.append(Fault(kind="disk_full",
                            detail=f"disk {disk_used_pct:.1f}% used > {args.disk_max_pct:g}%"))
    if memory_pct > args.memory_max_pct:
        faults.append(Fault(kind="memory_pressure",
                            detail=f"memory {memory_pct:.1f}% used > {args.memory_max_pct:g}%"))
    return faults


def host_only(faults: Iterable[Fault]) -> bool:
    """True when there are faults and every one of them is a host fault."""
    kinds = [f.kind for f in faults]
    return bool(kinds) and all(k in HOST_FAULT_KINDS for k in kinds)
