"""The production selector: `select(task, candidates, snapshot, now, rng, config) -> Decision`.

Pure and deterministic: the only randomness is one seed drawn from `rng` (or `rng` itself
when it is an int), recorded in the decision, so `replay(decision.to_dict())` reproduces it.

Per candidate (docs/routing-policy.md §Selection): not ready, quarantined (open), half-open
with its single trial in flight, saturated (in flight >= max_ongoing), cold (n_eff <
warmup_n) with its probe in flight, or stalled (work in flight, no outcome for long) ->
ineligible, with the reason. Eligible arms are scored `theta * P(on time) - load_weight *
inflight / limit - latency_weight * latency`, theta a Thompson sample of the arm's Beta
posterior in a share `exploration_rate` of the decisions and its posterior mean otherwise (a
lower bound for critical tasks), equal scores drawn at random; a half-open arm gets its
single trial from an ordinary first attempt. Fallback groups are tried in order: the first
group with an eligible arm whose posterior mean is at least `fallback_floor`, else the group
with the best such mean. The task's `avoid` (from `retry_plan`) is relaxed step by step
(other node and model -> other arm -> any) rather than fail. When nothing is eligible the
least-bad arm by posterior mean is chosen (`panic`): a task never fails because every
candidate is quarantined. Only when every ready candidate is at its concurrency limit is
there no choice (`saturated`: wait and select again).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from services.router.policy.codec import from_flat, to_flat
from services.router.policy.config import DEFAULT_CONFIG, SelectorConfig
from services.router.policy.retry import Attempt, Avoid, RetryBudget, RetryPlan, Task, retry_plan
from services.router.policy.stats import (
    TRIGGERS,
    ArmState,
    Estimate,
    Estimator,
    QState,
    StatsSnapshot,
    arm_key,
    keys_for,
    wilson,
    z_for,
)
from services.router.policy.updates import begin

__all__ = [
    "Attempt", "Avoid", "Candidate", "CandidateView", "Decision", "DecisionInputs",
    "RetryBudget", "RetryPlan", "Status", "Task", "commit", "replay", "retry_plan", "select",
    "snapshot_keys",
]

Status = Literal["selected", "fallback", "panic", "saturated", "no_candidates"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One arm that can run the task: `model` (name and version) loaded on `node`."""

    model: str
    node: str
    family: str
    group: int = 0                   # fallback order: 0 primary, 1 first fallback, ...
    ready: bool = True               # loaded and ready on the node (reported by its agent)
    predecessor: str | None = None   # the version this one replaces (its prior)
    max_ongoing: int | None = None   # per-target limit; None: config.max_ongoing

    @property
    def arm(self) -> str:
        return arm_key(self.model, self.node)


@dataclass(frozen=True, slots=True)
class CandidateView:
    """One candidate as the decision saw it: statistics, verdict and why."""

    arm: str
    model: str
    node: str
    family: str
    group: int
    eligible: bool
    reason: str
    state: str            # closed | cold | open | half_open
    alpha: float
    beta: float
    n_eff: float
    mean: float
    lower: float
    upper: float
    prior_mean: float
    model_mean: float
    node_mean: float
    inflight: int
    limit: int
    latency_s: float
    on_time: float
    sample: float | None
    score: float | None
    avoided: int          # 0 no, 1 its node or model is avoided, 2 this arm was tried

    def to_dict(self) -> dict[str, Any]:
        """Floats rounded to 6 decimals (the exact inputs are in the decision's `inputs`)."""
        return {k: round(v, 6) if isinstance(v, float) else v
                for k, v in asdict(self).items()}


@dataclass(frozen=True, slots=True)
class DecisionInputs:
    """Everything `select` read: replaying these gives the same decision."""

    task: Task
    candidates: tuple[Candidate, ...]
    snapshot: StatsSnapshot
    now: float
    seed: int
    config: SelectorConfig

    def to_dict(self) -> dict[str, Any]:
        t = self.task
        return {
            "task": {"task_id": t.task_id, "task_type": t.task_type, "priority": t.priority,
                     "deadline": t.deadline, "critical": t.critical, "attempt": t.attempt,
                     "avoid": t.avoid.to_dict()},
            "candidates": [asdict(c) for c in self.candidates],
            # zeros are left out: from_flat restores them as defaults
            "snapshot": {k: v for k, v in
                         to_flat(self.snapshot.subset(snapshot_keys(self.candidates))).items()
                         if v != 0.0},
            "now": self.now,
            "seed": self.seed,
            "config": self.config.model_dump(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DecisionInputs:
        t = dict(data["task"])
        t["avoid"] = Avoid.from_dict(t.get("avoid", {}))
        return cls(task=Task(**t),
                   candidates=tuple(Candidate(**c) for c in data["candidates"]),
                   snapshot=from_flat(data["snapshot"]), now=float(data["now"]),
                   seed=int(data["seed"]), config=SelectorConfig.model_validate(data["config"]))


@dataclass(frozen=True, slots=True)
class Decision:
    """The choice (or none), every candidate's view, and the inputs to replay it."""

    task_id: str
    now: float
    seed: int
    policy_version: str
    status: Status
    model: str | None         # the choice: run `model` on `node` (None: no choice)
    node: str | None
    probe: bool               # the choice is a half-open trial: commit reserves its slot
    reason: str
    inputs: DecisionInputs
    _rows: tuple[_Row, ...] = field(repr=False, compare=False, default=())
    _views: list[CandidateView] = field(repr=False, compare=False, default_factory=list)

    @property
    def candidates(self) -> tuple[CandidateView, ...]:
        """Every candidate with its statistics, verdict and reason (built on first use)."""
        if not self._views and self._rows:
            chosen = self.chosen_arm
            tier = next((r.avoided for r in self._rows if r.cand.arm == chosen), 2)
            self._views.extend(_view(r, chosen, tier) for r in self._rows)
        return tuple(self._views)

    @property
    def chosen_arm(self) -> str | None:
        return arm_key(self.model, self.node) if self.model and self.node else None

    @property
    def chosen(self) -> CandidateView | None:
        """The chosen candidate's view."""
        arm = self.chosen_arm
        return next((v for v in self.candidates if v.arm == arm), None) if arm else None

    def to_dict(self, *, with_inputs: bool = True) -> dict[str, Any]:
        """A JSON-ready record (the `ModelSelected` event body); `replay` takes it back."""
        out: dict[str, Any] = {
            "task_id": self.task_id, "now": self.now, "seed": self.seed,
            "policy_version": self.policy_version, "status": self.status,
            "chosen": self.chosen_arm,
            "model": self.model, "node": self.node, "probe": self.probe,
            "reason": self.reason, "candidates": [v.to_dict() for v in self.candidates],
        }
        if with_inputs:
            out["inputs"] = self.inputs.to_dict()
        return out


def snapshot_keys(candidates: Sequence[Candidate]) -> list[str]:
    """The statistics keys a decision over `candidates` reads (load these, then select)."""
    keys: set[str] = set()
    for c in candidates:
        keys.update(keys_for(c.model, c.node, c.family, c.predecessor))
    return sorted(keys)


# --------------------------------------------------------------------------- select

@dataclass(slots=True)
class _Row:
    cand: Candidate
    est: Estimate
    state: str
    inflight: int
    limit: int
    latency: float
    on_time: float
    gate: str          # "" when eligible
    probe: bool        # eligible only as a single trial (half-open)
    avoided: int
    sample: float | None = None
    score: float | None = None


def _on_time(latency: float, remaining: float | None, slack: float) -> float:
    """1 while latency <= slack x time left, falling linearly to 0.05 at the deadline."""
    if remaining is None or remaining <= 0.0 or latency <= 0.0:
        return 1.0
    if latency <= slack * remaining:
        return 1.0
    return max(0.05, (remaining - latency) / ((1.0 - slack) * remaining) if slack < 1.0
               else 0.05)


def _exploit_value(est: Estimate, z: float | None, floor_at_prior: bool) -> float:
    """What a decision that does not explore ranks an arm by: its posterior mean, or (with
    `exploit_quantile`) a lower quantile of it, so a short lucky record does not outrank a long
    good one. `floor_at_prior`: good news is discounted only down to the arm's prior, so a new
    version that inherits a good predecessor's record competes with it at once."""
    if z is None:
        return est.mean
    low = wilson(est.alpha, est.alpha + est.beta, z)[0]
    if floor_at_prior and est.mean > est.prior_mean:
        return max(low, est.prior_mean)
    return low


def _fmt(x: float) -> str:
    return f"{x:.3f}"


def select(task: Task, candidates: Sequence[Candidate], snapshot: StatsSnapshot, now: float,
           rng: random.Random | int, config: SelectorConfig = DEFAULT_CONFIG) -> Decision:
    """Choose the arm for one attempt of `task` (see the module docstring).

    The decision in phases: assess every candidate (its estimate, load, latency and the
    first gate that shuts it), let the quarantine cap bring some back, score the eligible
    ones, then pick within the task's `avoid`, relaxed step by step, or settle without an
    eligible arm (panic, saturated, no candidates).
    """
    seed = rng if isinstance(rng, int) else rng.getrandbits(63)
    draw = random.Random(seed)
    unique = {c.arm: c for c in candidates}
    cands = tuple(sorted(unique.values(), key=lambda c: (c.group, c.model, c.node)))
    # The whole snapshot is kept by reference (it is immutable); to_dict() writes only the
    # entries these candidates read.
    inputs = DecisionInputs(task=task, candidates=cands, snapshot=snapshot, now=now,
                            seed=seed, config=config)
    rows = _assess(task, cands, snapshot, now, config)
    _apply_quarantine_cap(rows, now, config)
    _score(rows, task, config, draw)
    chosen, status, reason = _pick(rows, task, config, draw)
    return Decision(task_id=task.task_id, now=now, seed=seed,
                    policy_version=config.policy_version, status=status,
                    model=chosen.cand.model if chosen else None,
                    node=chosen.cand.node if chosen else None,
                    probe=bool(chosen and chosen.probe and status != "panic"), reason=reason,
                    inputs=inputs, _rows=tuple(rows))


@dataclass(frozen=True, slots=True)
class _Look:
    """What the gates read of one candidate."""

    cand: Candidate
    arm: ArmState
    est: Estimate
    q: QState
    cold: bool
    inflight: int
    limit: int
    age: float      # since its last dispatch or outcome, while work is in flight
    now: float
    config: SelectorConfig


def _not_ready(x: _Look) -> str:
    return "" if x.cand.ready else "not ready"


def _quarantined(x: _Look) -> str:
    if x.q != "open":
        return ""
    a = x.arm
    return (f"quarantined until {_fmt(a.q_until)} "
            f"({TRIGGERS[a.q_trigger] or 'trigger'}, level {a.q_level})")


def _trial_in_flight(x: _Look) -> str:
    return "half-open: trial in flight" if x.q == "half_open" and x.arm.probe_until > x.now else ""


def _saturated(x: _Look) -> str:
    return _saturated_reason(x.inflight, x.limit) if x.inflight >= x.limit else ""


def _cold_probe_in_flight(x: _Look) -> str:
    if x.cold and x.inflight >= x.config.cold_max_inflight:
        return f"cold (n_eff {x.est.n_eff:.1f}): probe in flight"
    return ""


def _stalled(x: _Look) -> str:
    a, config = x.arm, x.config
    stall_after = max(config.stall_factor * a.latency_s, config.stall_min_s)
    if x.inflight and a.latency_s > 0.0 and x.age > stall_after:
        return f"stalled: no outcome for {x.age:.1f} s with {x.inflight} in flight"
    return ""


# The gates in the order they are asked: the first that answers shuts the candidate out.
_GATES: tuple[Callable[[_Look], str], ...] = (
    _not_ready, _quarantined, _trial_in_flight, _saturated, _cold_probe_in_flight, _stalled)


def _first_gate(look: _Look) -> str:
    """Why the candidate is shut out: the first gate's answer ("" when eligible)."""
    for gate in _GATES:
        reason = gate(look)
        if reason:
            return reason
    return ""


def _saturated_reason(inflight: int, limit: int) -> str:
    return f"saturated: {inflight}/{limit} in flight"


def _assess(task: Task, cands: Sequence[Candidate], snapshot: StatsSnapshot, now: float,
            config: SelectorConfig) -> list[_Row]:
    """Phase 1: every candidate's estimate, load, latency, avoidance and gate."""
    est = Estimator(snapshot, now, config)
    remaining = None if task.deadline is None else task.deadline - now
    arms = snapshot.arms
    return [_assess_one(c, arms.get(c.arm) or ArmState(), est, task.avoid, remaining, now,
                        config) for c in cands]


def _assess_one(c: Candidate, a: ArmState, est: Estimator, avoid: Avoid,
                remaining: float | None, now: float, config: SelectorConfig) -> _Row:
    """One candidate as phase 1 sees it: the first gate that shuts it, if any."""
    e = est.arm(c.model, c.node, c.family, c.predecessor, a)
    inflight = a.live_inflight(now, config)
    limit = c.max_ongoing or config.max_ongoing
    q = a.q_state(now)
    cold = q == "closed" and e.n_eff < config.warmup_n
    age = now - max(a.busy_since, a.last_outcome) if inflight else 0.0
    latency = max(a.latency_s, age)
    look = _Look(c, a, e, q, cold, inflight, limit, age, now, config)
    gate = _first_gate(look)
    avoided = 2 if c.arm in avoid.arms else (
        1 if c.node in avoid.nodes or c.model in avoid.models else 0)
    # A half-open arm no gate shuts is eligible for its single trial only.
    return _Row(c, e, "cold" if cold else q, inflight, limit, latency,
                _on_time(latency, remaining, config.deadline_slack), gate,
                not gate and q == "half_open", avoided)


def _score(rows: list[_Row], task: Task, config: SelectorConfig, draw: random.Random) -> None:
    """Phase 3: every eligible row's sample (a lower bound for a critical task, else a
    Thompson sample when this decision explores, else its exploit value) and its score."""
    critical_z = z_for(config.critical_quantile) if task.critical else 0.0
    exploit_z = None if config.exploit_quantile is None else z_for(config.exploit_quantile)
    # One draw per decision: explore (Thompson) or exploit (posterior mean).
    explore = config.exploration_rate >= 1.0 or draw.random() < config.exploration_rate
    for r in rows:
        if r.gate:
            continue
        if task.critical:
            r.sample = wilson(r.est.alpha, r.est.alpha + r.est.beta, critical_z)[0]
        elif explore:
            r.sample = draw.betavariate(r.est.alpha, r.est.beta)
        else:
            r.sample = _exploit_value(r.est, exploit_z, config.successor_floor
                                      and r.cand.predecessor is not None)
        r.score = (r.sample * r.on_time - config.load_weight * r.inflight / r.limit
                   - config.latency_weight * r.latency)


# What each tier of the task's `avoid` gives up: nothing, the arm, the arm again.
_RELAXED = ("", " (avoid relaxed: another arm)", " (avoid relaxed: same arm again)")


def _pick(rows: list[_Row], task: Task, config: SelectorConfig,
          draw: random.Random) -> tuple[_Row | None, Status, str]:
    """Phase 4: the choice among the eligible rows, avoiding what the task avoids first and
    relaxing it tier by tier; with no eligible row at all, phase 5."""
    primary = min((r.cand.group for r in rows if r.cand.ready), default=0)
    for tier, relaxed in enumerate(_RELAXED):
        pool = [r for r in rows if not r.gate and r.avoided <= tier]
        if pool:
            chosen, why = _choose(pool, task, config, draw)
            status: Status = "fallback" if chosen.cand.group != primary else "selected"
            return chosen, status, why + relaxed
    return _without_eligible(rows)


def _without_eligible(rows: list[_Row]) -> tuple[_Row | None, Status, str]:
    """Phase 5: no eligible arm. The least-bad arm with room by posterior mean (`panic`), else
    wait for a slot (`saturated`), else nothing is ready (`no_candidates`)."""
    spare = [r for r in rows if r.cand.ready and r.inflight < r.limit]
    if spare:
        chosen = min(spare, key=lambda r: (r.avoided, -r.est.mean, r.cand.arm))
        return chosen, "panic", ("every candidate ineligible: least-bad by posterior mean "
                                 f"({_fmt(chosen.est.mean)})")
    if any(r.cand.ready for r in rows):
        return None, "saturated", "every ready candidate is at its concurrency limit: wait"
    return None, "no_candidates", "no candidate is ready"


def _apply_quarantine_cap(rows: list[_Row], now: float, config: SelectorConfig) -> None:
    """At most max_quarantined_fraction of the ready candidates stay out (at least one may):
    the least bad of the rest come back as single trials."""
    ready = [r for r in rows if r.cand.ready]
    out = [r for r in ready if r.state == "open"]
    allowed = max(1, int(config.max_quarantined_fraction * len(ready)))
    if len(out) <= allowed:
        return
    back = sorted(out, key=lambda r: (-r.est.mean, r.cand.arm))[: len(out) - allowed]
    for r in back:
        r.state = "half_open"
        if r.inflight >= r.limit:
            r.gate = _saturated_reason(r.inflight, r.limit)
        else:
            r.gate = ""
            r.probe = True


def _choose(pool: list[_Row], task: Task, config: SelectorConfig,
            draw: random.Random) -> tuple[_Row, str]:
    """Pick within the first acceptable fallback group: a due trial, else the best score
    (equal scores, e.g. fresh arms or saturated samples, drawn at random, not by name)."""
    groups = sorted({r.cand.group for r in pool})[: config.max_fallback_depth]
    best_mean = {g: max(r.est.mean for r in pool if r.cand.group == g) for g in groups}
    group = next((g for g in groups if best_mean[g] >= config.fallback_floor), None)
    if group is None:
        group = max(groups, key=lambda g: (best_mean[g], -g))
        why_group = (f"group {group}: no group has an arm at the floor "
                     f"{_fmt(config.fallback_floor)}; best mean {_fmt(best_mean[group])}")
    elif group != groups[0]:
        why_group = (f"group {group}: earlier groups below the floor "
                     f"{_fmt(config.fallback_floor)}")
    else:
        why_group = f"group {group}"
    members = [r for r in pool if r.cand.group == group]
    # A half-open arm gets its single trial from an ordinary first attempt, never from a
    # retry or a critical task, so it can come back without waiting for its counts to decay.
    trials = [r for r in members if r.probe]
    if trials and task.attempt == 1 and not task.critical:
        r = trials[0]
        return r, f"{why_group}; half-open trial of {r.cand.arm}"
    ranked = [r for r in members if not r.probe] or members
    top = max(r.score or 0.0 for r in ranked)
    tied = [r for r in ranked if (r.score or 0.0) >= top - 1e-12]
    r = tied[0] if len(tied) == 1 else draw.choice(tied)
    kind = "lower bound" if task.critical else "Thompson sample"
    return r, (f"{why_group}; best score {_fmt(r.score or 0.0)} ({kind} "
               f"{_fmt(r.sample or 0.0)}, mean {_fmt(r.est.mean)})")


def _view(r: _Row, chosen: str | None, avoid_used: int) -> CandidateView:
    reason = r.gate
    eligible = not r.gate
    if eligible and r.avoided > avoid_used:
        eligible = False
        reason = ("avoided: this arm already failed" if r.avoided == 2
                  else "avoided: its node or model failed this task")
    if not reason:
        reason = ("chosen" if chosen == r.cand.arm
                  else "eligible: trial" if r.probe else "eligible")
    e = r.est
    return CandidateView(
        arm=r.cand.arm, model=r.cand.model, node=r.cand.node, family=r.cand.family,
        group=r.cand.group, eligible=eligible, reason=reason, state=r.state, alpha=e.alpha,
        beta=e.beta, n_eff=e.n_eff, mean=e.mean, lower=e.lower, upper=e.upper,
        prior_mean=e.prior_mean, model_mean=e.model_mean, node_mean=e.node_mean,
        inflight=r.inflight, limit=r.limit, latency_s=r.latency, on_time=r.on_time,
        sample=r.sample, score=r.score, avoided=r.avoided)


def commit(snapshot: StatsSnapshot, decision: Decision,
           config: SelectorConfig = DEFAULT_CONFIG) -> StatsSnapshot:
    """`snapshot` after dispatching the decision's choice (in flight + 1, trial reserved)."""
    if decision.model is None or decision.node is None:
        return snapshot
    return begin(snapshot, decision.model, decision.node, decision.now, config,
                 probe=decision.probe)


def replay(record: Decision | DecisionInputs | Mapping[str, Any]) -> Decision:
    """The decision again from its recorded inputs (a Decision, its inputs, or `to_dict()`)."""
    if isinstance(record, Decision):
        inputs = record.inputs
    elif isinstance(record, DecisionInputs):
        inputs = record
    else:
        data = record.get("inputs", record)
        inputs = DecisionInputs.from_dict(data)
    return select(inputs.task, inputs.candidates, inputs.snapshot, inputs.now, inputs.seed,
                  inputs.config)
