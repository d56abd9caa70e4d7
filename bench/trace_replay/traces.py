"""The two traces: the Philly busy-node series and Titan's GPU failures, read and mapped
onto the simulated fleet (pure: no broker, no Redis)."""

from __future__ import annotations

import csv
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from schemas.events.v1 import Fault

# Kept in the repository with their provenance (bench/traces/README.md).
DEFAULT_TRACES = Path(__file__).resolve().parent.parent / "traces"
PHILLY_FILE = "helios/philly_node_sequence.csv"
TITAN_FILE = "titan_gpu/titan_gpu_failure_events_derived.csv"
# NVIDIA's XIDs for the two Titan event classes: 48 is "double bit ECC error", 79 "GPU has
# fallen off the bus". The published playbook the analyzer uses reboots for 48 and replaces
# for 79.
TITAN_XID = {"DBE": 48, "OTB": 79}


def trace_time(text: str) -> datetime:
    """A trace timestamp (the traces carry no zone) on the trace's own clock, as UTC."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@dataclass(frozen=True)
class PhillyMinute:
    """One row of the Philly series: busy and all GPU nodes at one minute."""

    time: datetime
    active: int
    total: int

    @property
    def busy_fraction(self) -> float:
        return self.active / self.total if self.total > 0 else 0.0


def read_philly(path: Path, start: datetime, minutes: int) -> list[PhillyMinute]:
    """`minutes` consecutive rows from the first at or after `start`.

    Rows, not clock minutes: the series has one 10-hour gap (2017-10-25 14:00 to 10-26
    00:00), and a window across it jumps over the gap as the trace does.
    """
    out: list[PhillyMinute] = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            at = trace_time(row["time"])
            if at < start:
                continue
            out.append(PhillyMinute(at, int(row["active"]), int(row["total"])))
            if len(out) == minutes:
                break
    return out


def busy_target(minute: PhillyMinute, nodes: int) -> int:
    """How many of the simulated nodes are busy: the trace's busy share of the fleet."""
    return min(nodes, max(0, round(minute.busy_fraction * nodes)))


class BusyAssigner:
    """Which nodes are busy. Sticky, as jobs are: when the busy count changes, only as many
    nodes change as must, chosen at random (seeded) among the idle or the busy ones."""

    def __init__(self, nodes: Sequence[str], seed: int) -> None:
        self.rng = random.Random(seed)
        self.idle = list(nodes)
        self.busy: list[str] = []

    def assign(self, target: int) -> tuple[list[str], list[str]]:
        """Move nodes until `target` are busy; returns (became busy, became idle)."""
        target = min(max(target, 0), len(self.idle) + len(self.busy))
        started: list[str] = []
        stopped: list[str] = []
        while len(self.busy) < target:
            node = self.idle.pop(self.rng.randrange(len(self.idle)))
            self.busy.append(node)
            started.append(node)
        while len(self.busy) > target:
            node = self.busy.pop(self.rng.randrange(len(self.busy)))
            self.idle.append(node)
            stopped.append(node)
        return started, stopped


def node_offsets(nodes: Sequence[str], jitter_pct: float, seed: int) -> dict[str, float]:
    """A fixed load offset per node, so that busy (and idle) nodes are not all identical."""
    rng = random.Random(seed + 1)
    return {n: rng.uniform(-jitter_pct, jitter_pct) for n in nodes}


def clamp_pct(value: float) -> float:
    return min(max(value, 0.0), 100.0)


@dataclass(frozen=True)
class TitanEvent:
    """One GPU failure on Titan: when, on which node, which GPU (serial), which class."""

    at: datetime
    node: str
    serial: str
    event: str


def read_titan(path: Path, start: datetime, days: float) -> list[TitanEvent]:
    """The failure events in [start, start + days), in time order."""
    end = start + timedelta(days=days)
    out: list[TitanEvent] = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            at = trace_time(row["event_time"])
            if start <= at < end:
                out.append(TitanEvent(at, row["node"], row["SN"], row["event"]))
    return sorted(out, key=lambda e: e.at)


def titan_faults(event: TitanEvent) -> list[Fault]:
    """What a simulated node reports for a Titan event, as the agent reports the same fault
    seen through NVML (an XID, plus the uncorrected ECC error of a DBE)."""
    detail = f"titan {event.event} gpu {event.serial} at {event.at:%Y-%m-%d %H:%M:%S}"
    faults = [Fault(kind="xid", code=TITAN_XID[event.event], gpu_index=0, detail=detail)]
    if event.event == "DBE":
        faults.append(Fault(kind="ecc", gpu_index=0, detail=f"1 uncorrected ECC error; {detail}"))
    return faults
