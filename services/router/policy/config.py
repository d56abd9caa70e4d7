"""The selector's tunable limits, one frozen value shared by stats, selector and retries."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

POLICY_VERSION = "1"


class SelectorConfig(BaseModel):
    """Every knob of the selection policy (docs/routing-policy.md).

    Defaults: the starting values of docs/routing-policy.md §Defaults, then tuned with
    `python -m bench.routing --seed-base 1` (seeds 1..20, never reported): half-life
    60 -> 300 s, exploration 1.0 -> 0.1, arm prior mass 4 -> 8, latency tie-breaker
    0 -> 0.03, the fast window with change points, then CUSUM change points, split blame
    for ambiguous failures and exploitation by the lower quartile
    (docs/routing.md §How the defaults were tuned).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    policy_version: str = POLICY_VERSION
    # Statistics: success/failure counts halve every `half_life_s` (None: never decay).
    half_life_s: Annotated[float, Field(gt=0.0)] | None = 300.0
    # Each arm also keeps a fast window (half-life `fast_half_life_s`, None: off). When the
    # window holds at least `change_min_n` outcomes and its Wilson interval at `change_z`
    # excludes the arm's long-term posterior mean, a change point is recorded and the
    # arm's long counts restart from the window: a quiet degradation is seen in a few tasks
    # instead of a half-life, and it stays seen after traffic moves away.
    fast_half_life_s: Annotated[float, Field(gt=0.0)] | None = 15.0
    change_z: Annotated[float, Field(gt=0.0)] = 2.576
    change_min_n: Annotated[float, Field(ge=0.0)] = 5.0
    # A sudden drop is caught sooner by Page's CUSUM on the same outcomes: the log-likelihood
    # ratio of "failure rate x cusum_ratio" against the long-term rate, summed while positive;
    # at cusum_h a change point restarts the long counts from the outcomes since the sum
    # last left zero (the failures and the few successes among them), not from the window,
    # whose pre-change successes would keep the level looking healthy. None: off.
    cusum_h: Annotated[float, Field(gt=0.0)] | None = 4.5
    cusum_ratio: Annotated[float, Field(gt=1.0)] = 10.0
    # The same test on each model (its model faults) and node (its node faults); a change
    # there keeps only `change_forget` of the history of every arm of that model or node.
    level_changes: bool = True
    change_forget: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1
    # A timeout or an unclassified failure could be the model's or the node's: split its
    # weight between them in proportion to how much each already fails (explaining away), so
    # a slow model's timeouts do not make every node it runs on look bad. False: count it
    # fully against both.
    split_ambiguous: bool = True
    # Peak-EWMA latency time constant (Finagle/ServiceTalk decayTime).
    latency_tau_s: Annotated[float, Field(gt=0.0)] = 10.0
    # Estimator: global prior, shrinkage of each parent level, prior mass of an arm.
    global_prior_mean: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.95
    global_prior_mass: Annotated[float, Field(gt=0.0)] = 2.0
    level_prior_mass: Annotated[float, Field(gt=0.0)] = 4.0
    arm_prior_mass: Annotated[float, Field(gt=0.0)] = 8.0
    hierarchy: bool = True
    # Cold arms (n_eff below warmup_n) take at most `cold_max_inflight` tasks at a time.
    warmup_n: Annotated[float, Field(ge=0.0)] = 10.0
    cold_max_inflight: Annotated[int, Field(ge=1)] = 1
    # Per-target concurrency limit (Ray Serve's max_ongoing_requests default).
    max_ongoing: Annotated[int, Field(ge=1)] = 5
    # Score = theta * P(on time) - load_weight * inflight / max_ongoing
    #         - latency_weight * latency_s (latency only breaks near-ties).
    load_weight: Annotated[float, Field(ge=0.0)] = 0.01
    latency_weight: Annotated[float, Field(ge=0.0)] = 0.03
    # Share of decisions that rank by a Thompson sample; the others rank by the posterior
    # mean (LiteLLM adaptive's exploration_rate; 1.0 = always sample).
    exploration_rate: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1
    # Decisions that do not explore rank by this lower quantile of the posterior (Wilson),
    # None: by the mean. Pessimism in exploitation keeps an arm whose good record is short
    # (a lucky streak) from taking the traffic of arms known to be good.
    exploit_quantile: Annotated[float, Field(gt=0.0, lt=0.5)] | None = 0.25
    # ... except for a new version (a candidate with a predecessor) doing better than the
    # prior it inherited: it ranks at least at that prior, so it ramps up as fast as its
    # record allows instead of waiting for a long one.
    successor_floor: bool = True
    # Critical tasks rank by this lower quantile of the posterior instead of a sample.
    critical_quantile: Annotated[float, Field(gt=0.0, lt=0.5)] = 0.10
    # Deadline: an arm whose latency estimate is above `deadline_slack` x time left loses weight.
    deadline_slack: Annotated[float, Field(gt=0.0)] = 0.8
    # Quarantine triggers: consecutive counted failures, or a posterior mean below the floor.
    quarantine: bool = True
    consecutive_failures: Annotated[int, Field(ge=1)] = 3
    floor: Annotated[float, Field(ge=0.0, le=1.0)] = 0.8
    floor_min_n: Annotated[float, Field(ge=0.0)] = 10.0
    # Quarantine length: min(base * 2^(k-1), max) * (1 + jitter * u); k drops by one per
    # healthy level_decay_s.
    quarantine_base_s: Annotated[float, Field(gt=0.0)] = 10.0
    quarantine_max_s: Annotated[float, Field(gt=0.0)] = 120.0
    quarantine_jitter: Annotated[float, Field(ge=0.0, le=1.0)] = 0.2
    level_decay_s: Annotated[float, Field(gt=0.0)] = 60.0
    # Share of failures kept when a half-open trial succeeds (1.0: keep all, decayed).
    close_keep_failures: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    # At most this share of a task's candidates quarantined at once (at least one may be).
    max_quarantined_fraction: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    # A reserved half-open trial slot is given back after this long without an outcome.
    probe_timeout_s: Annotated[float, Field(gt=0.0)] = 60.0
    # In-flight counts untouched for this long are treated as lost (0).
    inflight_ttl_s: Annotated[float, Field(gt=0.0)] = 600.0
    # An arm with work in flight and no outcome for max(stall_factor x latency, stall_min_s).
    stall_factor: Annotated[float, Field(gt=0.0)] = 3.0
    stall_min_s: Annotated[float, Field(gt=0.0)] = 5.0
    # Fallback groups: a later group is used when no arm of an earlier one has a posterior
    # mean at or above this floor; at most max_fallback_depth groups (LiteLLM's 5).
    fallback_floor: Annotated[float, Field(ge=0.0, le=1.0)] = 0.8
    max_fallback_depth: Annotated[int, Field(ge=1)] = 5
    # Retries (Envoy retry budget: 20 %, at least 3 concurrent).
    max_retries: Annotated[int, Field(ge=0)] = 2
    retry_budget_fraction: Annotated[float, Field(ge=0.0, le=1.0)] = 0.2
    min_retry_concurrency: Annotated[int, Field(ge=0)] = 3
    diversify_retries: bool = True


DEFAULT_CONFIG = SelectorConfig()
