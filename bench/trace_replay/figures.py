"""The replays' figures: pure arithmetic on what the services published, and the services'
settings for a time-compressed replay."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bench.fleet_sim import FaultyReport
from schemas.events.v1 import NodeState, OpsNeed
from services.analyzer.needs.load_balance import Args as LoadBalanceArgs
from services.analyzer.needs.online import Args as OnlineArgs
from services.analyzer.needs.scale import Args as ScaleArgs
from services.analyzer.settings import AnalyzerSettings

NEED_KINDS = ("scale_out", "scale_in", "load_balance", "offline", "online")


def minute_index(at: float, t0: float, seconds_per_minute: float) -> int:
    """The replayed trace minute a real moment falls in (negative: before the replay)."""
    return math.floor((at - t0) / seconds_per_minute)


def describe(values: Iterable[float]) -> dict[str, float] | None:
    items = list(values)
    if not items:
        return None
    return {"min": round(min(items), 2), "mean": round(statistics.fmean(items), 2),
            "max": round(max(items), 2)}


def silent_transitions(states: Iterable[NodeState], t0: float) -> dict[str, int]:
    """Nodes the collector saw as suspect or down, before and during the replay.

    No replay silences a node, so any count here is the machine not keeping up (a report
    applied later than the heartbeat allows), which the figures must be read with.
    """
    counts: Counter[str] = Counter()
    for state in states:
        if state.state in ("suspect", "down"):
            when = "warmup" if state.occurred_at.timestamp() < t0 else "window"
            counts[f"{state.state}_{when}"] += 1
    return dict(counts)


def compressed_env(factor: float, pool_period_s: float, report_interval_s: float,
                   suspect_after_intervals: float) -> dict[str, str]:
    """Service settings for a replay where one real second stands for 1/factor trace seconds.

    Hold periods and the open-need lifetime are the services' defaults times `factor` (read
    from the settings models, so they follow any change of default). The open-need lifetime
    is whole seconds, at least 1. Heartbeat thresholds are not compressed: they are loosened
    to a few report intervals so scheduling jitter on a small shared machine never reads as
    a silent node (no replay here silences a node).
    """
    ttl_default = AnalyzerSettings.model_fields["open_need_ttl_s"].default
    return {
        "ANALYZER_SCALE__HOLD_S": f"{ScaleArgs().hold_s * factor:.4f}",
        "ANALYZER_LOAD_BALANCE__HOLD_S": f"{LoadBalanceArgs().hold_s * factor:.4f}",
        "ANALYZER_ONLINE__HOLD_S": f"{OnlineArgs().hold_s * factor:.4f}",
        "ANALYZER_OPEN_NEED_TTL_S": str(max(1, round(ttl_default * factor))),
        "ANALYZER_POOL_PERIOD_S": f"{pool_period_s:.4f}",
        "COLLECTOR_SUSPECT_AFTER_INTERVALS": f"{suspect_after_intervals:g}",
        "COLLECTOR_DOWN_AFTER_S":
            f"{max(2.0, (suspect_after_intervals + 2) * report_interval_s):.3f}",
        "COLLECTOR_PROBE_PERIOD_S": "30",
        "COLLECTOR_PROBE_DEADLINE_S": "5",
    }


@dataclass(frozen=True)
class Injection:
    """One injected failure: `first` if its node was reporting no injected fault then."""

    tag: str
    node: str
    event: str
    at: float  # epoch seconds
    first: bool


@dataclass
class Attribution:
    """Which injected failures an offline need answered, and what became of the others."""

    need_at: dict[str, float] = field(default_factory=dict)  # tag -> first need's arrival
    untraced: int = 0  # offline needs not from an injected fault (e.g. a failed probe)
    untraced_nodes: set[str] = field(default_factory=set)
    covered: list[str] = field(default_factory=list)  # an open need already covered it
    missed: list[str] = field(default_factory=list)


def attribute(injections: Sequence[Injection], needs: Sequence[tuple[OpsNeed, float]],
              faulty_reports: Mapping[str, FaultyReport], open_need_ttl_s: float,
              grace_s: float) -> Attribution:
    """Trace each offline need (and when it arrived) back to the injections in its report.

    An offline need's correlation id is the event id of the report that raised it, and the
    simulator keeps the injection tags of every faulty report it sent. An injection no need
    cites is `covered` when a need on its node was raised within the open-need lifetime
    before it (or during its own faulty reports, `grace_s`): an identical open need is not
    raised again, by design. Anything else is `missed`.
    """
    out = Attribution()
    raised_on: dict[str, list[float]] = {}
    for need, arrived in needs:
        raised_on.setdefault(need.target, []).append(need.occurred_at.timestamp())
        report = faulty_reports.get(need.correlation_id or "")
        if report is None:
            out.untraced += 1
            out.untraced_nodes.add(need.target)
            continue
        for tag in report.tags:
            out.need_at[tag] = min(out.need_at.get(tag, arrived), arrived)
    for injection in injections:
        if injection.tag in out.need_at:
            continue
        if any(injection.at - open_need_ttl_s <= r <= injection.at + grace_s
               for r in raised_on.get(injection.node, [])):
            out.covered.append(injection.tag)
        else:
            out.missed.append(injection.tag)
    return out
