"""Decayed statistics per arm (model@node) and its parents, and what they estimate.

Levels: `arm:<model>@<node>`, `model:<model>`, `node:<node>`, `family:<family>`, `global`
(so model and node ids must not contain `@` or `|`). Counts halve every `half_life_s` (`s <-
s * 2^(-dt/H) + 1{ok}`), lazily: each entry keeps the time it was last decayed. Arms, models
and nodes also keep a fast window (`fast_half_life_s`) and a CUSUM (`cusum_h`). An arm also
keeps a peak-EWMA latency, its in-flight count, consecutive failures and its quarantine
state. Everything is a frozen value. How an outcome or a dispatch changes these values
(`record`, `begin`): `updates`; how they are stored in Redis hashes: `codec`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from statistics import NormalDist
from typing import Literal

from services.router.policy.attribution import Cause
from services.router.policy.config import DEFAULT_CONFIG, SelectorConfig

GLOBAL = "global"
ARM_SEP = "@"
QState = Literal["closed", "open", "half_open"]
# Why an arm was quarantined, stored as a number in the flat codec.
TRIGGERS: tuple[str, ...] = ("", "consecutive", "floor", "trial_failed")
# One-sided 95 % (the Wilson bounds shown in every decision).
_Z95 = 1.6448536269514722


def arm_key(model: str, node: str) -> str:
    """The key of one arm: `arm:<model>@<node>`."""
    return f"arm:{model}{ARM_SEP}{node}"


def model_key(model: str) -> str:
    return f"model:{model}"


def node_key(node: str) -> str:
    return f"node:{node}"


def family_key(family: str) -> str:
    return f"family:{family}"


def keys_for(model: str, node: str, family: str, predecessor: str | None = None) -> list[str]:
    """Every key the estimate of one arm reads (what an adapter must load)."""
    keys = [arm_key(model, node), model_key(model), node_key(node), family_key(family), GLOBAL]
    if predecessor:
        keys.append(model_key(predecessor))
    return keys


def record_keys(model: str, node: str, family: str, predecessor: str | None,
                known_arms: Iterable[str]) -> list[str]:
    """Every key `record` may read or change for an outcome on model@node: `keys_for` plus
    the arms in `known_arms` (arm keys, e.g. from `snapshot_keys(candidates)`) that share
    its model or its node, whose history a model or node change point discounts."""
    keys = set(keys_for(model, node, family, predecessor))
    for key in known_arms:
        if key.startswith("arm:"):
            arm_model, arm_node = split_arm_key(key)
            if arm_model == model or arm_node == node:
                keys.add(key)
    return sorted(keys)


def split_arm_key(key: str) -> tuple[str, str]:
    """(model, node) of an arm key."""
    model, _, node = key[len("arm:"):].rpartition(ARM_SEP)
    return model, node


@dataclass(frozen=True, slots=True)
class Counts:
    """Decayed outcome counts of one level, by attributed cause, as of `updated`."""

    ok: float = 0.0
    node_fault: float = 0.0
    model_fault: float = 0.0
    timeout: float = 0.0
    unknown: float = 0.0
    updated: float = 0.0
    # Model and node levels also keep a fast window of their own attributed outcomes
    # (ok and model faults for a model, ok and node faults for a node).
    recent_ok: float = 0.0
    recent_fail: float = 0.0
    recent_at: float = 0.0
    # Page's CUSUM of those outcomes and what it summed since it last left zero.
    cusum: float = 0.0
    seg_ok: float = 0.0
    seg_fail: float = 0.0

    @property
    def failures(self) -> float:
        return self.node_fault + self.model_fault + self.timeout + self.unknown

    @property
    def n(self) -> float:
        """Effective sample size (decayed successes + counted failures)."""
        return self.ok + self.failures


@dataclass(frozen=True, slots=True)
class ArmState:
    """Everything one arm remembers besides its counts' parents."""

    counts: Counts = field(default_factory=Counts)
    fast_ok: float = 0.0          # the fast window (fast_half_life_s), as of fast_at
    fast_fail: float = 0.0
    fast_at: float = 0.0
    cusum: float = 0.0            # Page's CUSUM of the arm's outcomes (see SelectorConfig)
    seg_ok: float = 0.0           # outcomes since the CUSUM last left zero
    seg_fail: float = 0.0
    changes: int = 0              # change points detected (long counts restarted)
    changed_at: float = 0.0
    latency_s: float = 0.0        # peak-EWMA; 0 = no sample yet
    latency_at: float = 0.0
    consecutive: int = 0          # counted failures in a row
    inflight: int = 0
    busy_since: float = 0.0       # when inflight last went from 0 to 1
    touched: float = 0.0          # last begin or outcome
    last_outcome: float = 0.0
    quarantined: bool = False     # open until q_until, then half-open until a trial ends
    q_until: float = 0.0
    q_level: int = 0              # k of the exponential backoff
    q_changed: float = 0.0
    q_trigger: int = 0            # index into TRIGGERS
    probe_until: float = 0.0      # a half-open trial (or cold probe) slot is taken until then
    flaps: int = 0                # quarantines entered, ever

    def q_state(self, now: float) -> QState:
        """closed, open (until q_until) or half_open (waiting for one trial)."""
        if not self.quarantined:
            return "closed"
        return "open" if now < self.q_until else "half_open"

    def live_inflight(self, now: float, config: SelectorConfig = DEFAULT_CONFIG) -> int:
        """In-flight count, or 0 when nothing touched the arm for `inflight_ttl_s` (lost)."""
        if self.inflight and now - self.touched > config.inflight_ttl_s:
            return 0
        return self.inflight


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    """The statistics a decision reads: parent levels by key, arms by arm key."""

    levels: Mapping[str, Counts] = field(default_factory=dict)
    arms: Mapping[str, ArmState] = field(default_factory=dict)

    def level(self, key: str) -> Counts:
        return self.levels.get(key, EMPTY_COUNTS)

    def arm(self, model: str, node: str) -> ArmState:
        return self.arms.get(arm_key(model, node), EMPTY_ARM)

    def subset(self, keys: Iterable[str]) -> StatsSnapshot:
        """Only the entries under `keys` (what a decision record carries)."""
        wanted = set(keys)
        return StatsSnapshot(
            levels={k: v for k, v in sorted(self.levels.items()) if k in wanted},
            arms={k: v for k, v in sorted(self.arms.items()) if k in wanted})

    def merge(self, other: StatsSnapshot) -> StatsSnapshot:
        """This snapshot with `other`'s entries laid over it."""
        return StatsSnapshot(levels={**self.levels, **other.levels},
                             arms={**self.arms, **other.arms})


# What a level or an arm is before its first outcome.
EMPTY_COUNTS = Counts()
EMPTY_ARM = ArmState()


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one dispatched attempt ended, as reported (or timed out) for model@node."""

    model: str
    node: str
    family: str
    cause: Cause
    latency_s: float | None = None
    predecessor: str | None = None
    # False for a refusal that was never dispatched (no in-flight slot to give back).
    dispatched: bool = True


# --------------------------------------------------------------------------- decay

def decay_factor(dt: float, half_life_s: float | None) -> float:
    """The weight left after `dt` seconds at `half_life_s` (1 without a half-life)."""
    if half_life_s is None or dt <= 0.0:
        return 1.0
    return math.exp2(-dt / half_life_s)


def decay_counts(counts: Counts, now: float, half_life_s: float | None) -> Counts:
    """`counts` decayed from their `updated` time to `now` (never forwards in time)."""
    if now <= counts.updated:
        return counts
    w = decay_factor(now - counts.updated, half_life_s)
    return Counts(counts.ok * w, counts.node_fault * w, counts.model_fault * w,
                  counts.timeout * w, counts.unknown * w, now, counts.recent_ok,
                  counts.recent_fail, counts.recent_at, counts.cusum, counts.seg_ok,
                  counts.seg_fail)


def decay(snapshot: StatsSnapshot, now: float,
          config: SelectorConfig = DEFAULT_CONFIG) -> StatsSnapshot:
    """Every entry of `snapshot` decayed to `now`."""
    h = config.half_life_s
    return StatsSnapshot(
        levels={k: decay_counts(c, now, h) for k, c in snapshot.levels.items()},
        arms={k: replace(a, counts=decay_counts(a.counts, now, h))
              for k, a in snapshot.arms.items()})




# --------------------------------------------------------------------------- estimate

@dataclass(frozen=True, slots=True)
class Estimate:
    """The posterior of one arm: Beta(alpha, beta) with the prior built from its parents."""

    prior_mean: float
    model_mean: float
    node_mean: float
    alpha: float
    beta: float
    n_eff: float
    mean: float
    n_fast: float = 0.0       # outcomes in the fast window
    fast_mean: float = 0.0    # their raw success rate (0 when empty)

    @property
    def lower(self) -> float:
        """Wilson 95 % one-sided lower bound on (alpha, beta)."""
        return wilson(self.alpha, self.alpha + self.beta, _Z95)[0]

    @property
    def upper(self) -> float:
        return wilson(self.alpha, self.alpha + self.beta, _Z95)[1]


def _shrunk(ok: float, failures: float, parent: float, mass: float) -> float:
    return (ok + mass * parent) / (ok + failures + mass)


def wilson(successes: float, n: float, z: float) -> tuple[float, float]:
    """Wilson score interval of successes/n at z (n = 0: (0, 1))."""
    if n <= 0.0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    centre = p + z2 / (2.0 * n)
    half = z * math.sqrt(max(p * (1.0 - p) / n + z2 / (4.0 * n * n), 0.0))
    denom = 1.0 + z2 / n
    return max(0.0, (centre - half) / denom), min(1.0, (centre + half) / denom)


@lru_cache(maxsize=32)
def z_for(quantile: float) -> float:
    """z of a one-sided lower `quantile` (0.10 -> 1.2816)."""
    return NormalDist().inv_cdf(1.0 - quantile)


class Estimator:
    """Estimates arms of one snapshot at one time, decaying each parent level only once."""

    __slots__ = ("_config", "_g_model", "_g_node", "_levels", "_means", "_mu_global", "_now",
                 "_snapshot")

    def __init__(self, snapshot: StatsSnapshot, now: float,
                 config: SelectorConfig = DEFAULT_CONFIG) -> None:
        self._snapshot = snapshot
        self._now = now
        self._config = config
        self._levels: dict[str, tuple[float, float]] = {}
        self._means: dict[tuple[str, str, str | None], float] = {}
        g = decay_counts(snapshot.level(GLOBAL), now, config.half_life_s)
        pm, mg = config.global_prior_mean, config.global_prior_mass
        # The global rate split into its model part and its node part.
        self._g_model = _shrunk(g.ok, g.model_fault + g.timeout + g.unknown, math.sqrt(pm), mg)
        self._g_node = _shrunk(g.ok, g.node_fault + g.timeout + g.unknown, math.sqrt(pm), mg)
        self._mu_global = _shrunk(g.ok, g.failures, pm, mg)

    def _level(self, key: str) -> tuple[float, float]:
        """(successes, failures) of a level, decayed to now (computed once per key)."""
        pair = self._levels.get(key)
        if pair is None:
            c = self._snapshot.levels.get(key)
            if c is None:
                pair = (0.0, 0.0)
            else:
                w = decay_factor(self._now - c.updated, self._config.half_life_s)
                pair = (c.ok * w, c.failures * w)
            self._levels[key] = pair
        return pair

    def model_mean(self, model: str, family: str, predecessor: str | None = None) -> float:
        """The model factor: model -> predecessor (if it has data) -> family -> global."""
        memo = (model, family, predecessor)
        cached = self._means.get(memo)
        if cached is not None:
            return cached
        mass = self._config.level_prior_mass
        f_ok, f_fail = self._level(family_key(family))
        parent = _shrunk(f_ok, f_fail, self._g_model, mass)
        if predecessor:
            p_ok, p_fail = self._level(model_key(predecessor))
            if p_ok + p_fail > 0.0:
                parent = _shrunk(p_ok, p_fail, parent, mass)
        m_ok, m_fail = self._level(model_key(model))
        mean = self._means[memo] = _shrunk(m_ok, m_fail, parent, mass)
        return mean

    def node_mean(self, node: str) -> float:
        """The node factor, shrunk towards the global node part."""
        memo = ("", node, None)
        cached = self._means.get(memo)
        if cached is not None:
            return cached
        n_ok, n_fail = self._level(node_key(node))
        mean = self._means[memo] = _shrunk(n_ok, n_fail, self._g_node,
                                           self._config.level_prior_mass)
        return mean

    def arm(self, model: str, node: str, family: str, predecessor: str | None = None,
            state: ArmState | None = None) -> Estimate:
        """The posterior of model@node (`state`: its ArmState, if the caller has it)."""
        config = self._config
        if state is None:
            state = self._snapshot.arm(model, node)
        c = state.counts
        w_long = decay_factor(self._now - c.updated, config.half_life_s)
        a_ok, a_fail = c.ok * w_long, c.failures * w_long
        if config.hierarchy:
            model_mean = self.model_mean(model, family, predecessor)
            node_mean = self.node_mean(node)
            mu = model_mean * node_mean
        else:
            mu = model_mean = node_mean = self._mu_global
        mu = min(max(mu, 0.01), 0.999)
        m0 = config.arm_prior_mass
        alpha = m0 * mu + a_ok
        beta = m0 * (1.0 - mu) + a_fail
        w = decay_factor(self._now - state.fast_at, config.fast_half_life_s)
        n_fast = (state.fast_ok + state.fast_fail) * w
        return Estimate(prior_mean=mu, model_mean=model_mean, node_mean=node_mean,
                        alpha=alpha, beta=beta, n_eff=a_ok + a_fail,
                        mean=alpha / (alpha + beta),
                        n_fast=n_fast, fast_mean=state.fast_ok / (state.fast_ok
                                                                  + state.fast_fail)
                        if n_fast > 0.0 else 0.0)


def estimate(snapshot: StatsSnapshot, model: str, node: str, family: str, now: float,
             config: SelectorConfig = DEFAULT_CONFIG,
             predecessor: str | None = None) -> Estimate:
    """Hierarchical shrinkage (docs/routing-policy.md §Estimator) of one arm, decayed to `now`.

    The arm's prior mean is p_model * p_node: node faults are counted only on nodes and
    model faults only on models, so the two factors are the independent ways to fail. Each
    factor is shrunk towards its parent (model -> predecessor version if it has data, else
    family -> global; node -> global) with `level_prior_mass`; the arm's own decayed counts
    (every counted failure, whatever its cause) then update Beta(m0*mu, m0*(1-mu)).
    """
    return Estimator(snapshot, now, config).arm(model, node, family, predecessor)

