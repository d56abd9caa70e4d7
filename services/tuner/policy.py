"""Pure tuning policy: decayed measures of delivered throughput, and when a template's tuned
parameter changes.

A template opts in with a `tuning:` section (services/templater/tuning_spec.py) naming an
integer parameter and the capacity one task must add. The parameter's value is then
clamp(ceil(capacity_per_task / measured throughput per node)): nodes that deliver twice as
much mean half as many of them per scale-out. It changes only when the measured figure has
drifted past the threshold from the figure the active version was tuned at (its evidence),
or, for a version never tuned, from the figure its value implies (capacity_per_task / value),
so noise around a steady figure never makes a new version.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from services.templater.tuning_spec import Tuning

# The evidence key holding the figure a tuned version was tuned at.
TUNED_AT = "measured_throughput_per_node"


@dataclass(frozen=True)
class Measure:
    """The decayed throughput per node of one node type in one pool, and its sample count."""

    cluster: str
    pool: str
    node_type: str
    throughput_per_node: float
    gpus_per_node: float
    samples: int
    at: float

    @property
    def throughput_per_gpu(self) -> float:
        return self.throughput_per_node / self.gpus_per_node if self.gpus_per_node else 0.0

    def as_evidence(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "pool": self.pool, "node_type": self.node_type,
                "throughput_per_node": round(self.throughput_per_node, 3),
                "throughput_per_gpu": round(self.throughput_per_gpu, 3),
                "gpus_per_node": round(self.gpus_per_node, 3), "samples": self.samples}


def decayed(previous: float | None, value: float, alpha: float) -> float:
    """One EWMA step: the first value as it is, then previous + alpha * (value - previous)."""
    return value if previous is None else previous + alpha * (value - previous)


@dataclass(frozen=True)
class Figure:
    """What the measures say together: throughput per node weighted by samples."""

    throughput_per_node: float
    samples: int


def combined(measures: Iterable[Measure]) -> Figure:
    """The sample-weighted mean throughput per node over every pool and node type."""
    found = list(measures)
    samples = sum(m.samples for m in found)
    if not samples:
        return Figure(0.0, 0)
    return Figure(sum(m.throughput_per_node * m.samples for m in found) / samples, samples)


Verdict = Literal["tune", "pinned", "too_few_samples", "no_throughput", "within_threshold",
                  "same_value"]


@dataclass(frozen=True)
class Decision:
    """What the tuner does with one template, and the figures behind it."""

    verdict: Verdict
    current: int
    value: int
    measured: float
    baseline: float
    drift: float
    samples: int
    reason: str

    @property
    def acts(self) -> bool:
        return self.verdict == "tune"


def target_value(tuning: Tuning, measured: float) -> int:
    """clamp(ceil(capacity_per_task / measured)) into [min_value, max_value]."""
    wanted = math.ceil(round(tuning.capacity_per_task / measured, 9))
    return max(tuning.min_value, min(tuning.max_value, wanted))


def baseline_of(tuning: Tuning, current: int, evidence: Mapping[str, Any]) -> float:
    """The figure the active version stands for: the one it was tuned at, else the one its
    value implies."""
    tuned_at = evidence.get(TUNED_AT)
    if isinstance(tuned_at, (int, float)) and not isinstance(tuned_at, bool) and tuned_at > 0:
        return float(tuned_at)
    return tuning.capacity_per_task / current if current > 0 else 0.0


def decide(tuning: Tuning, current: int, evidence: Mapping[str, Any], figure: Figure,
           pinned: bool) -> Decision:
    """Whether to save a new version with the parameter at a new value, and why."""
    baseline = baseline_of(tuning, current, evidence)
    measured = figure.throughput_per_node
    drift = abs(measured - baseline) / baseline if baseline > 0 else math.inf
    verdict, value, reason = _verdict(tuning, current, measured, baseline, drift,
                                      figure.samples, pinned)
    return Decision(verdict=verdict, current=current, value=value, measured=measured,
                    baseline=baseline, drift=drift, samples=figure.samples, reason=reason)


def _verdict(tuning: Tuning, current: int, measured: float, baseline: float, drift: float,
             samples: int, pinned: bool) -> tuple[Verdict, int, str]:
    figures = (f"measured {measured:.1f} per node over {samples} samples, "
               f"tuned at {baseline:.1f}")
    if samples < tuning.min_samples:
        return "too_few_samples", current, f"{samples} samples, {tuning.min_samples} needed"
    if measured <= 0:
        return "no_throughput", current, "no throughput measured"
    value = target_value(tuning, measured)
    if drift <= tuning.drift_threshold:
        return "within_threshold", current, (f"{figures}: drift {drift:.0%} within "
                                             f"{tuning.drift_threshold:.0%}")
    if value == current:
        return "same_value", current, (f"{figures}: drift {drift:.0%}, but "
                                       f"{tuning.parameter} stays {current}")
    change = (f"{figures} (drift {drift:.0%} > {tuning.drift_threshold:.0%}): "
              f"{tuning.parameter} {current} -> {value} "
              f"(ceil({tuning.capacity_per_task:g} / {measured:.1f}))")
    if pinned:
        return "pinned", value, f"pinned; would have set {change}"
    return "tune", value, change


def evidence_of(decision: Decision, tuning: Tuning, measures: Iterable[Measure]) -> dict[str, Any]:
    """What a tuned version records: the figures it was tuned at, per pool and node type."""
    return {TUNED_AT: round(decision.measured, 6), "parameter": tuning.parameter,
            "previous_value": decision.current, "value": decision.value,
            "baseline": round(decision.baseline, 6), "drift": round(decision.drift, 6),
            "samples": decision.samples, "capacity_per_task": tuning.capacity_per_task,
            "measures": [m.as_evidence() for m in measures]}
