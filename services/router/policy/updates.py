"""How the statistics change: an outcome (`record`) and a dispatch (`begin`).

`record` runs in phases: the outcome's counts on its parent levels (a timeout or
unclassified failure split between the model and the node in proportion to how much each
already fails) and their change points; the arm's in-flight slot and latency; its own counts
and change points; then its quarantine transition. A change point (the fast window
disagreeing with the long-term estimate, or the CUSUM crossing its threshold) restarts the
long counts; for a model or node, the history of each of its arms is discounted too.
Everything returns a new snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from hashlib import blake2b

from services.router.policy.attribution import COUNTED, Blame, Cause, attribute
from services.router.policy.config import DEFAULT_CONFIG, SelectorConfig
from services.router.policy.stats import (
    EMPTY_ARM,
    EMPTY_COUNTS,
    GLOBAL,
    TRIGGERS,
    ArmState,
    Counts,
    Estimator,
    Outcome,
    StatsSnapshot,
    arm_key,
    decay_counts,
    decay_factor,
    estimate,
    family_key,
    model_key,
    node_key,
    split_arm_key,
    wilson,
)


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
    blame = attribute(outcome.cause)
    levels = dict(snapshot.levels)
    arms = dict(snapshot.arms)
    if blame.counted:
        _count_levels(levels, snapshot, outcome, blame, now, config)
        _level_changes(levels, arms, outcome, now, config)
    key = arm_key(outcome.model, outcome.node)
    arm = _settle(arms.get(key, EMPTY_ARM), outcome, now, config)
    if blame.arm:
        arm = _count_arm(arm, key, outcome, levels, arms, now, config)
    arms[key] = _transition(arm, key, outcome, levels, arms, now, config)
    return StatsSnapshot(levels=levels, arms=arms)


def _count_levels(levels: dict[str, Counts], snapshot: StatsSnapshot, outcome: Outcome,
                  blame: Blame, now: float, config: SelectorConfig) -> None:
    """Phase 1: the outcome counted on the global level and on the model, family and node
    levels it blames; an ambiguous failure is shared by the model and the node."""
    h = config.half_life_s
    cause = outcome.cause
    w_model = w_node = 1.0
    if blame.model and blame.node and not blame.success and config.split_ambiguous:
        w_model = _model_share(snapshot, outcome, now, config)
        w_node = 1.0 - w_model
    levels[GLOBAL] = _add(levels.get(GLOBAL, EMPTY_COUNTS), cause, now, h)
    if blame.model:
        k = model_key(outcome.model)
        levels[k] = _add(levels.get(k, EMPTY_COUNTS), cause, now, h, w_model)
    if blame.family:
        k = family_key(outcome.family)
        levels[k] = _add(levels.get(k, EMPTY_COUNTS), cause, now, h, w_model)
    if blame.node:
        k = node_key(outcome.node)
        levels[k] = _add(levels.get(k, EMPTY_COUNTS), cause, now, h, w_node)


def _level_changes(levels: dict[str, Counts], arms: dict[str, ArmState], outcome: Outcome,
                   now: float, config: SelectorConfig) -> None:
    """Phase 2: the model's and the node's change-point tests, on the outcomes that speak
    of each (a success, or a fault of that level)."""
    if config.fast_half_life_s is None or not config.level_changes:
        return
    cause = outcome.cause
    if cause in ("ok", "model_fault"):
        _level_change(levels, arms, "model", outcome, cause == "ok", now, config)
    if cause in ("ok", "node_fault"):
        _level_change(levels, arms, "node", outcome, cause == "ok", now, config)


def _settle(arm: ArmState, outcome: Outcome, now: float, config: SelectorConfig) -> ArmState:
    """Phase 3: the attempt's in-flight slot given back and its latency sampled."""
    inflight = arm.live_inflight(now, config)
    if outcome.dispatched:
        # Only an attempt that ran gives a slot back and restarts the stall clock.
        arm = replace(arm, inflight=max(inflight - 1, 0), touched=now, last_outcome=now)
    if outcome.latency_s is not None and outcome.latency_s >= 0.0:
        arm = replace(arm, latency_s=_peak_ewma(arm, outcome.latency_s, now, config),
                      latency_at=now)
    return arm


def _count_arm(arm: ArmState, key: str, outcome: Outcome, levels: Mapping[str, Counts],
               arms: Mapping[str, ArmState], now: float, config: SelectorConfig) -> ArmState:
    """Phase 4: the outcome counted on the arm itself, then its fast window and CUSUM."""
    arm = replace(arm, counts=_add(arm.counts, outcome.cause, now, config.half_life_s))
    if config.fast_half_life_s is not None:
        arm = _fast(arm, key, outcome.cause == "ok", now, levels, arms, outcome, config)
    return arm


def _transition(arm: ArmState, key: str, outcome: Outcome, levels: Mapping[str, Counts],
                arms: Mapping[str, ArmState], now: float, config: SelectorConfig) -> ArmState:
    """Phase 5: the quarantine transition. A success closes a half-open arm; a counted
    failure opens a half-open arm again, or a closed one that meets a trigger."""
    state = arm.q_state(now)
    if outcome.cause == "ok":
        arm = replace(arm, consecutive=0)
        return _close(arm, now, config) if state == "half_open" else arm
    if outcome.cause not in COUNTED:
        return arm
    arm = replace(arm, consecutive=arm.consecutive + 1)
    if not config.quarantine:
        return arm
    if state == "half_open":
        return _open(arm, key, now, "trial_failed", config)
    if state == "closed":
        trigger = _trigger(arm, key, outcome, levels, arms, now, config)
        if trigger:
            return _open(arm, key, now, trigger, config)
    return arm


def _close(arm: ArmState, now: float, config: SelectorConfig) -> ArmState:
    """A half-open arm back in service, keeping `close_keep_failures` of its failures."""
    c = arm.counts
    keep = config.close_keep_failures
    return replace(arm, quarantined=False, q_changed=now, q_trigger=0, probe_until=0.0,
                   fast_fail=arm.fast_fail * keep,
                   counts=replace(c, node_fault=c.node_fault * keep,
                                  model_fault=c.model_fault * keep,
                                  timeout=c.timeout * keep, unknown=c.unknown * keep))


def _trigger(arm: ArmState, key: str, outcome: Outcome, levels: Mapping[str, Counts],
             arms: Mapping[str, ArmState], now: float, config: SelectorConfig) -> str:
    """Why a closed arm opens after a counted failure ("" when it stays closed): too many
    failures in a row, or enough samples and a posterior mean under the floor."""
    if arm.consecutive >= config.consecutive_failures:
        return "consecutive"
    if arm.counts.n >= config.floor_min_n:
        snap = StatsSnapshot(levels=levels, arms={**arms, key: arm})
        est = estimate(snap, outcome.model, outcome.node, outcome.family, now, config,
                       outcome.predecessor)
        if est.mean < config.floor:
            return "floor"
    return ""


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


def _level_change(levels: dict[str, Counts], arms: dict[str, ArmState], kind: str,
                  outcome: Outcome, ok: bool, now: float, config: SelectorConfig) -> None:
    """Update a model's or node's fast window and CUSUM; on a change point restart its counts
    and discount the history of every arm of that model (node) by `change_forget`, so its
    arms fall back on the parents and a model failing on one node is avoided on all."""
    target = outcome.model if kind == "model" else outcome.node
    k = model_key(target) if kind == "model" else node_key(target)
    c = levels[k]
    w = decay_factor(now - c.recent_at, config.fast_half_life_s)
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
        model, node = split_arm_key(key)
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
    w = decay_factor(now - arm.fast_at, config.fast_half_life_s)
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
    arm = snapshot.arms.get(key, EMPTY_ARM)
    inflight = arm.live_inflight(now, config)
    arm = replace(arm, inflight=inflight + 1, touched=now,
                  busy_since=now if inflight == 0 else arm.busy_since,
                  probe_until=now + config.probe_timeout_s if probe else arm.probe_until)
    arms = dict(snapshot.arms)
    arms[key] = arm
    return StatsSnapshot(levels=snapshot.levels, arms=arms)


def _add(counts: Counts, cause: Cause, now: float, half_life_s: float | None,
         weight: float = 1.0) -> Counts:
    """`counts` decayed to `now`, plus `weight` outcomes of `cause`."""
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
