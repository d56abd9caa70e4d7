"""Decayed statistics per arm (model@node) and its parents, and what they estimate.

Levels: `arm:<model>@<node>`, `model:<model>`, `node:<node>`, `family:<family>`, `global`
(so model and node ids must not contain `@` or `|`). Counts halve every `half_life_s` (`s <-
s * 2^(-dt/H) + 1{ok}`), lazily: each entry keeps the time it was last decayed. Arms, models
and nodes also keep a fast window (`fast_half_life_s`) and a CUSUM (`cusum_h`); when the
window disagrees with the long-term estimate, or the CUSUM crosses its threshold, a change
point restarts the long counts (for a model or node, the history of each of its arms is
discounted too). A timeout or unclassified failure is split between the model and the node
in proportion to how much each already fails. An arm also keeps a peak-EWMA latency, its in-
flight count, consecutive failures and its quarantine state. Everything is a frozen value;
`record` and `begin` return a new snapshot. `to_flat`/`from_flat` turn a snapshot into one
flat `dict[str, float]` (field `<key>|<name>`) for a Redis hash, and back;
`encode_counts`/`encode_arm` and `decode_counts`/`decode_arm` do the same per entry.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from hashlib import blake2b
from statistics import NormalDist
from typing import Literal

from services.router.policy.attribution import COUNTED, Cause, attribute
from services.router.policy.config import DEFAULT_CONFIG, SelectorConfig

GLOBAL = "global"
FIELD_SEP = "|"
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
            arm_model, arm_node = _split(key)
            if arm_model == model or arm_node == node:
                keys.add(key)
    return sorted(keys)


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
        return self.levels.get(key, _ZERO)

    def arm(self, model: str, node: str) -> ArmState:
        return self.arms.get(arm_key(model, node), _EMPTY_ARM)

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


_ZERO = Counts()
_EMPTY_ARM = ArmState()


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

def _factor(dt: float, half_life_s: float | None) -> float:
    if half_life_s is None or dt <= 0.0:
        return 1.0
    return math.exp2(-dt / half_life_s)


def decay_counts(counts: Counts, now: float, half_life_s: float | None) -> Counts:
    """`counts` decayed from their `updated` time to `now` (never forwards in time)."""
    if now <= counts.updated:
        return counts
    w = _factor(now - counts.updated, half_life_s)
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


def _add(counts: Counts, cause: Cause, now: float, half_life_s: float | None,
         weight: float = 1.0) -> Counts:
    c = decay_counts(counts, now, half_life_s)
    if c.updated < now:
        c = replace(c, updated=now)
    return _bump(c, cause, weight)


def _bump(c: Counts, cause: Cause, w: float = 1.0) -> Counts:
    if cause == "ok":
        return replace(c, ok=c.ok + w)
    if cause == "node_fault":
        return replace(c, node_fault=c.node_fault + w)
    if cause == "model_fault":
        return replace(c, model_fault=c.model_fault + w)
    if cause == "timeout":
        return replace(c, timeout=c.timeout + w)
    return replace(c, unknown=c.unknown + w)


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
                w = _factor(self._now - c.updated, self._config.half_life_s)
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
        w_long = _factor(self._now - c.updated, config.half_life_s)
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
        w = _factor(self._now - state.fast_at, config.fast_half_life_s)
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


# --------------------------------------------------------------------------- updates

def _jitter(key: str, flaps: int) -> float:
    """A deterministic fraction in [0, 1) per (arm, quarantine): replayable jitter."""
    digest = blake2b(f"{key}#{flaps}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def quarantine_seconds(key: str, level: int, flaps: int,
                       config: SelectorConfig = DEFAULT_CONFIG) -> float:
    """min(base * 2^(k-1), max) * (1 + jitter * u) for the k-th backoff level."""
    base = min(config.quarantine_base_s * 2.0 ** max(level - 1, 0), config.quarantine_max_s)
    return base * (1.0 + config.quarantine_jitter * _jitter(key, flaps))


def _open(arm: ArmState, key: str, now: float, trigger: str,
          config: SelectorConfig) -> ArmState:
    # k drops by one per healthy level_decay_s since the arm was closed; a failed trial
    # (still quarantined) goes one level up.
    healthy = 0
    if arm.q_level and not arm.quarantined:
        healthy = int(max(now - arm.q_changed, 0.0) // config.level_decay_s)
    level = max(arm.q_level - healthy, 0) + 1
    flaps = arm.flaps + 1
    until = now + quarantine_seconds(key, level, flaps, config)
    return replace(arm, quarantined=True, q_until=until, q_level=level, q_changed=now,
                   q_trigger=TRIGGERS.index(trigger), probe_until=0.0, flaps=flaps)


def record(snapshot: StatsSnapshot, outcome: Outcome, now: float,
           config: SelectorConfig = DEFAULT_CONFIG) -> StatsSnapshot:
    """`snapshot` after one outcome: counts by attribution, latency, quarantine transitions.

    Closed -> open on `consecutive_failures` counted failures in a row, or when the arm has
    `floor_min_n` decayed samples and a posterior mean under `floor`. Half-open: a success
    closes it (keeping `close_keep_failures` of its failures), a counted failure opens it
    again one backoff level higher. Outcomes while open only update the counts.

    A change point on the outcome's model or node also rewrites the other arms of that
    model or node that are in `snapshot`: load them (`record_keys`) and write back every
    entry that differs.
    """
    h = config.half_life_s
    blame = attribute(outcome.cause)
    levels = dict(snapshot.levels)
    arms = dict(snapshot.arms)
    cause = outcome.cause
    if blame.counted:
        w_model = w_node = 1.0
        if blame.model and blame.node and not blame.success and config.split_ambiguous:
            w_model = _model_share(snapshot, outcome, now, config)
            w_node = 1.0 - w_model
        levels[GLOBAL] = _add(levels.get(GLOBAL, _ZERO), cause, now, h)
        if blame.model:
            k = model_key(outcome.model)
            levels[k] = _add(levels.get(k, _ZERO), cause, now, h, w_model)
        if blame.family:
            k = family_key(outcome.family)
            levels[k] = _add(levels.get(k, _ZERO), cause, now, h, w_model)
        if blame.node:
            k = node_key(outcome.node)
            levels[k] = _add(levels.get(k, _ZERO), cause, now, h, w_node)
        if config.fast_half_life_s is not None and config.level_changes:
            if cause in ("ok", "model_fault"):
                _level_change(levels, arms, "model", outcome, cause == "ok", now, config)
            if cause in ("ok", "node_fault"):
                _level_change(levels, arms, "node", outcome, cause == "ok", now, config)

    key = arm_key(outcome.model, outcome.node)
    arm = arms.get(key, _EMPTY_ARM)
    inflight = arm.live_inflight(now, config)
    if outcome.dispatched:
        # Only an attempt that ran gives a slot back and restarts the stall clock.
        arm = replace(arm, inflight=max(inflight - 1, 0), touched=now, last_outcome=now)
    if outcome.latency_s is not None and outcome.latency_s >= 0.0:
        arm = replace(arm, latency_s=_peak_ewma(arm, outcome.latency_s, now, config),
                      latency_at=now)
    if blame.arm:
        arm = replace(arm, counts=_add(arm.counts, cause, now, h))
        if config.fast_half_life_s is not None:
            arm = _fast(arm, key, cause == "ok", now, levels, arms, outcome, config)

    state = arm.q_state(now)
    failed = cause in COUNTED
    if cause == "ok":
        arm = replace(arm, consecutive=0)
        if state == "half_open":
            c = arm.counts
            keep = config.close_keep_failures
            arm = replace(arm, quarantined=False, q_changed=now, q_trigger=0, probe_until=0.0,
                          fast_fail=arm.fast_fail * keep,
                          counts=replace(c, node_fault=c.node_fault * keep,
                                         model_fault=c.model_fault * keep,
                                         timeout=c.timeout * keep, unknown=c.unknown * keep))
    elif failed:
        arm = replace(arm, consecutive=arm.consecutive + 1)
        if config.quarantine:
            if state == "half_open":
                arm = _open(arm, key, now, "trial_failed", config)
            elif state == "closed":
                trigger = ""
                if arm.consecutive >= config.consecutive_failures:
                    trigger = "consecutive"
                elif arm.counts.n >= config.floor_min_n:
                    snap = StatsSnapshot(levels=levels, arms={**arms, key: arm})
                    est = estimate(snap, outcome.model, outcome.node, outcome.family, now,
                                   config, outcome.predecessor)
                    if est.mean < config.floor:
                        trigger = "floor"
                if trigger:
                    arm = _open(arm, key, now, trigger, config)
    arms[key] = arm
    return StatsSnapshot(levels=levels, arms=arms)


def _model_share(snapshot: StatsSnapshot, outcome: Outcome, now: float,
                 config: SelectorConfig) -> float:
    """The share of an ambiguous failure (timeout, unclassified) laid on the model rather
    than the node: their failure rates so far, normalised (1/2 when both look perfect)."""
    est = Estimator(snapshot, now, config)
    q_model = 1.0 - est.model_mean(outcome.model, outcome.family, outcome.predecessor)
    q_node = 1.0 - est.node_mean(outcome.node)
    total = q_model + q_node
    return q_model / total if total > 0.0 else 0.5


def _restart(c: Counts, ok: float, fail: float, now: float) -> Counts:
    """Long counts replaced by a window's (failures keep their causes' proportions)."""
    share = fail / c.failures if c.failures > 0.0 else 0.0
    return replace(c, ok=ok, node_fault=c.node_fault * share,
                   model_fault=c.model_fault * share, timeout=c.timeout * share,
                   unknown=c.unknown * share if c.failures > 0.0 else fail, updated=now)


def _split(key: str) -> tuple[str, str]:
    """(model, node) of an arm key."""
    model, _, node = key[len("arm:"):].rpartition(ARM_SEP)
    return model, node


def _level_change(levels: dict[str, Counts], arms: dict[str, ArmState], kind: str,
                  outcome: Outcome, ok: bool, now: float, config: SelectorConfig) -> None:
    """Update a model's or node's fast window and CUSUM; on a change point restart its counts
    and discount the history of every arm of that model (node) by `change_forget`, so its
    arms fall back on the parents and a model failing on one node is avoided on all."""
    target = outcome.model if kind == "model" else outcome.node
    k = model_key(target) if kind == "model" else node_key(target)
    c = levels[k]
    w = _factor(now - c.recent_at, config.fast_half_life_s)
    r_ok = c.recent_ok * w + ok
    r_fail = c.recent_fail * w + (not ok)
    c = levels[k] = replace(c, recent_ok=r_ok, recent_fail=r_fail,
                            recent_at=max(now, c.recent_at))
    n = r_ok + r_fail
    if config.cusum_h is None and n < config.change_min_n:
        return
    est = Estimator(StatsSnapshot(levels=levels, arms=arms), now, config)
    long_mean = (est.model_mean(outcome.model, outcome.family, outcome.predecessor)
                 if kind == "model" else est.node_mean(outcome.node))
    restart: tuple[float, float] | None = None
    if config.cusum_h is not None:
        s, seg_ok, seg_fail = _cusum_step(c.cusum, c.seg_ok, c.seg_fail, ok, long_mean,
                                          config)
        if s >= config.cusum_h:
            restart = (seg_ok, seg_fail)
            s = seg_ok = seg_fail = 0.0
        c = levels[k] = replace(c, cusum=s, seg_ok=seg_ok, seg_fail=seg_fail)
    if restart is None:
        if n < config.change_min_n:
            return
        low, high = wilson(r_ok, n, config.change_z)
        if low <= long_mean <= high:
            return
        restart = (r_ok, r_fail)
    else:
        # The window restarts with the change too, so it does not test the new counts
        # against the pre-change successes it still holds.
        c = replace(c, recent_ok=restart[0], recent_fail=restart[1])
    levels[k] = _restart(c, restart[0], restart[1], now)
    keep = config.change_forget
    for key, a in list(arms.items()):
        model, node = _split(key)
        if (model if kind == "model" else node) == target:
            ac = decay_counts(a.counts, now, config.half_life_s)
            arms[key] = replace(a, counts=replace(
                ac, ok=ac.ok * keep, node_fault=ac.node_fault * keep,
                model_fault=ac.model_fault * keep, timeout=ac.timeout * keep,
                unknown=ac.unknown * keep))


def _cusum_step(s: float, seg_ok: float, seg_fail: float, ok: bool, mean: float,
                config: SelectorConfig) -> tuple[float, float, float]:
    """One step of Page's CUSUM for a failure rate q0 = 1 - mean rising to
    q1 = min(cusum_ratio * q0, 0.5): S <- max(0, S + log-likelihood ratio), and the outcomes
    summed since S last left zero (reset with it)."""
    q0 = min(max(1.0 - mean, 1e-4), 0.5)
    q1 = min(q0 * config.cusum_ratio, 0.5)
    if q1 <= q0:
        return 0.0, 0.0, 0.0
    s += math.log((1.0 - q1) / (1.0 - q0)) if ok else math.log(q1 / q0)
    if s <= 0.0:
        return 0.0, 0.0, 0.0
    return s, seg_ok + ok, seg_fail + (not ok)


def _fast(arm: ArmState, key: str, ok: bool, now: float, levels: Mapping[str, Counts],
          arms: Mapping[str, ArmState], outcome: Outcome, config: SelectorConfig) -> ArmState:
    """Update the fast window and the CUSUM; on a change point restart the long counts."""
    w = _factor(now - arm.fast_at, config.fast_half_life_s)
    f_ok = arm.fast_ok * w + ok
    f_fail = arm.fast_fail * w + (not ok)
    arm = replace(arm, fast_ok=f_ok, fast_fail=f_fail, fast_at=max(now, arm.fast_at))
    n = f_ok + f_fail
    if config.cusum_h is None and n < config.change_min_n:
        return arm
    snap = StatsSnapshot(levels=levels, arms={**arms, key: arm})
    long_mean = Estimator(snap, now, config).arm(outcome.model, outcome.node, outcome.family,
                                                 outcome.predecessor, arm).mean
    if config.cusum_h is not None:
        s, seg_ok, seg_fail = _cusum_step(arm.cusum, arm.seg_ok, arm.seg_fail, ok,
                                          long_mean, config)
        if s >= config.cusum_h:
            return replace(arm, counts=_restart(arm.counts, seg_ok, seg_fail, now),
                           fast_ok=seg_ok, fast_fail=seg_fail, cusum=0.0, seg_ok=0.0,
                           seg_fail=0.0, changes=arm.changes + 1, changed_at=now)
        arm = replace(arm, cusum=s, seg_ok=seg_ok, seg_fail=seg_fail)
    if n < config.change_min_n:
        return arm
    low, high = wilson(f_ok, n, config.change_z)
    if low <= long_mean <= high:
        return arm
    return replace(arm, counts=_restart(arm.counts, f_ok, f_fail, now),
                   changes=arm.changes + 1, changed_at=now)


def _peak_ewma(arm: ArmState, sample: float, now: float, config: SelectorConfig) -> float:
    """Finagle's Peak-EWMA: jump to any higher sample, decay towards lower ones."""
    if arm.latency_s <= 0.0 or sample > arm.latency_s:
        return sample
    w = math.exp(-max(now - arm.latency_at, 0.0) / config.latency_tau_s)
    return arm.latency_s * w + sample * (1.0 - w)


def begin(snapshot: StatsSnapshot, model: str, node: str, now: float,
          config: SelectorConfig = DEFAULT_CONFIG, *, probe: bool = False) -> StatsSnapshot:
    """`snapshot` after dispatching one attempt to model@node (in-flight + 1; a probe
    reserves the arm's single trial slot for `probe_timeout_s`)."""
    key = arm_key(model, node)
    arm = snapshot.arms.get(key, _EMPTY_ARM)
    inflight = arm.live_inflight(now, config)
    arm = replace(arm, inflight=inflight + 1, touched=now,
                  busy_since=now if inflight == 0 else arm.busy_since,
                  probe_until=now + config.probe_timeout_s if probe else arm.probe_until)
    arms = dict(snapshot.arms)
    arms[key] = arm
    return StatsSnapshot(levels=snapshot.levels, arms=arms)


# --------------------------------------------------------------------------- codec

_COUNT_FIELDS = tuple(f.name for f in fields(Counts))
_ARM_FIELDS = tuple(f.name for f in fields(ArmState) if f.name != "counts")
_INT_FIELDS = frozenset(f.name for f in fields(ArmState) if f.type in ("int", "bool"))


def encode_counts(counts: Counts) -> dict[str, float]:
    """One level as a flat hash."""
    return {name: float(getattr(counts, name)) for name in _COUNT_FIELDS}


def encode_arm(arm: ArmState) -> dict[str, float]:
    """One arm as a flat hash (counts fields first, then the arm's own)."""
    out = encode_counts(arm.counts)
    for name in _ARM_FIELDS:
        out[name] = float(getattr(arm, name))
    return out


def _num(value: float | int | str | bytes) -> float:
    if isinstance(value, bytes):
        value = value.decode()
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"not a finite number: {value!r}")
    return number


def decode_counts(hash_: Mapping[str, float | int | str | bytes]) -> Counts:
    """A level from its flat hash; missing fields are 0."""
    return Counts(**{n: _num(hash_[n]) for n in _COUNT_FIELDS if n in hash_})


def decode_arm(hash_: Mapping[str, float | int | str | bytes]) -> ArmState:
    """An arm from its flat hash; missing fields take their defaults."""
    values: dict[str, float | int | bool] = {}
    for name in _ARM_FIELDS:
        if name in hash_:
            number = _num(hash_[name])
            if name == "quarantined":
                values[name] = number != 0.0
            elif name in _INT_FIELDS:
                values[name] = int(number)
            else:
                values[name] = number
    return ArmState(counts=decode_counts(hash_), **values)  # type: ignore[arg-type]


def to_flat(snapshot: StatsSnapshot) -> dict[str, float]:
    """The whole snapshot as one flat hash: `<key>|<field>` -> value."""
    out: dict[str, float] = {}
    for key, counts in sorted(snapshot.levels.items()):
        for name, value in encode_counts(counts).items():
            out[f"{key}{FIELD_SEP}{name}"] = value
    for key, arm in sorted(snapshot.arms.items()):
        for name, value in encode_arm(arm).items():
            out[f"{key}{FIELD_SEP}{name}"] = value
    return out


def from_flat(flat: Mapping[str, float | int | str | bytes]
              | Mapping[bytes, float | int | str | bytes]) -> StatsSnapshot:
    """A snapshot from `to_flat`'s hash (str or bytes keys and values, as Redis returns)."""
    grouped: dict[str, dict[str, float | int | str | bytes]] = {}
    for raw_key, value in flat.items():
        text = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
        key, sep, name = text.rpartition(FIELD_SEP)
        if not sep:
            raise ValueError(f"not a snapshot field: {text!r}")
        grouped.setdefault(key, {})[name] = value
    levels = {k: decode_counts(v) for k, v in grouped.items() if not k.startswith("arm:")}
    arms = {k: decode_arm(v) for k, v in grouped.items() if k.startswith("arm:")}
    return StatsSnapshot(levels=levels, arms=arms)
