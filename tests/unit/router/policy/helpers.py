"""Builders shared by the policy tests."""

from __future__ import annotations

from collections.abc import Iterable

from services.router.policy.attribution import Cause
from services.router.policy.config import SelectorConfig
from services.router.policy.selector import Candidate
from services.router.policy.stats import Outcome, StatsSnapshot
from services.router.policy.updates import begin, record

# No jitter and no fast window, so durations and counts are exact in the tests; a 60 s
# half-life keeps the arithmetic simple.
CONFIG = SelectorConfig(quarantine_jitter=0.0, fast_half_life_s=None, half_life_s=60.0)


def feed(snapshot: StatsSnapshot, cand: Candidate, causes: Iterable[Cause], start: float = 0.0,
         step: float = 0.1, config: SelectorConfig = CONFIG) -> StatsSnapshot:
    """Dispatch and record one outcome per cause on `cand`, `step` seconds apart."""
    t = start
    for cause in causes:
        snapshot = begin(snapshot, cand.model, cand.node, t, config)
        snapshot = record(snapshot, Outcome(cand.model, cand.node, cand.family, cause, 0.2,
                                            cand.predecessor), t + step / 2, config)
        t += step
    return snapshot
