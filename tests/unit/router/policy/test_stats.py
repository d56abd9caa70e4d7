"""Decayed statistics, the estimator (cold start, shrinkage, hierarchy) and the flat codec."""

from __future__ import annotations

import math

import pytest

from services.router.policy.attribution import Cause
from services.router.policy.codec import from_flat, to_flat
from services.router.policy.config import SelectorConfig
from services.router.policy.selector import Candidate
from services.router.policy.stats import (
    GLOBAL,
    Counts,
    Estimator,
    Outcome,
    StatsSnapshot,
    arm_key,
    decay,
    decay_counts,
    estimate,
    model_key,
    node_key,
    record_keys,
    wilson,
)
from services.router.policy.updates import record
from tests.unit.router.policy.helpers import CONFIG, feed

A1 = Candidate("a:v1", "n1", "fam")
A2 = Candidate("a:v1", "n2", "fam")
B1 = Candidate("b:v1", "n1", "fam")
C3 = Candidate("c:v1", "n3", "other")


def test_counts_halve_every_half_life() -> None:
    c = Counts(ok=8.0, model_fault=4.0, updated=10.0)
    d = decay_counts(c, 70.0, 60.0)
    assert d.ok == pytest.approx(4.0)
    assert d.model_fault == pytest.approx(2.0)
    assert d.updated == 70.0
    assert decay_counts(c, 5.0, 60.0) == c          # never forwards in time
    assert decay_counts(c, 1e6, None).ok == 8.0     # no decay configured


def test_decay_of_a_snapshot_touches_every_entry() -> None:
    snap = feed(StatsSnapshot(), A1, ["ok"] * 4)
    later = decay(snap, 60.0 + 0.4, CONFIG)
    assert later.levels[GLOBAL].n == pytest.approx(snap.levels[GLOBAL].n / 2, rel=0.02)
    assert later.arms[A1.arm].counts.n == pytest.approx(2.0, rel=0.02)


def test_record_counts_by_attribution() -> None:
    snap = feed(StatsSnapshot(), A1, ["ok", "node_fault", "model_fault", "capacity",
                                      "bad_input"])
    arm = snap.arms[A1.arm].counts
    assert (arm.ok, arm.node_fault, arm.model_fault) == pytest.approx((1, 1, 1), rel=0.01)
    node = snap.levels[node_key("n1")]
    model = snap.levels[model_key("a:v1")]
    assert node.node_fault > 0
    assert node.model_fault == 0
    assert model.model_fault > 0
    assert model.node_fault == 0
    # capacity and bad input count against nobody, but give the in-flight slot back
    assert snap.arms[A1.arm].inflight == 0
    assert snap.levels[GLOBAL].n == pytest.approx(3.0, rel=0.01)


def test_cold_start_uses_the_parents_with_little_weight() -> None:
    est = estimate(StatsSnapshot(), "new:v1", "n9", "fam", 0.0, CONFIG)
    assert est.n_eff == 0.0
    # Global prior split into a model and a node factor: their product is the prior mean.
    assert est.prior_mean == pytest.approx(CONFIG.global_prior_mean, rel=1e-6)
    assert est.alpha + est.beta == pytest.approx(CONFIG.arm_prior_mass)


def test_shrinkage_few_samples_stay_near_the_prior_many_dominate() -> None:
    snap = feed(StatsSnapshot(), A2, ["ok"] * 200)            # a healthy sibling arm
    few = feed(snap, A1, ["model_fault"], start=20.0)
    e_few = estimate(few, A1.model, A1.node, A1.family, 20.1, CONFIG)
    # one failure in one sample: pulled down, but nowhere near 0
    assert 0.5 < e_few.mean < e_few.prior_mean
    many = feed(snap, A1, ["model_fault"] * 40, start=20.0)
    e_many = estimate(many, A1.model, A1.node, A1.family, 24.0, CONFIG)
    assert e_many.mean < 0.2


def test_a_new_version_inherits_its_predecessor() -> None:
    good = Candidate("m:v1", "n1", "fam")
    bad = Candidate("z:v1", "n1", "fam")
    snap = feed(StatsSnapshot(), good, ["ok"] * 100)
    snap = feed(snap, bad, ["model_fault"] * 100, start=10.0)
    now = 20.0
    from_good = estimate(snap, "m:v2", "n2", "fam", now, CONFIG, predecessor="m:v1")
    from_bad = estimate(snap, "m:v2", "n2", "fam", now, CONFIG, predecessor="z:v1")
    assert from_good.n_eff == from_bad.n_eff == 0.0
    assert from_good.prior_mean > from_bad.prior_mean + 0.2


def test_a_flaky_node_lowers_every_arm_on_it() -> None:
    snap = feed(StatsSnapshot(), A2, ["ok"] * 100)
    snap = feed(snap, C3, ["ok"] * 100, start=10.0)
    snap = feed(snap, A1, ["node_fault"] * 10, start=20.0)
    now = 21.0
    b_on_flaky_node = estimate(snap, B1.model, B1.node, B1.family, now, CONFIG)
    b_elsewhere = estimate(snap, B1.model, "n3", B1.family, now, CONFIG)
    assert b_on_flaky_node.n_eff == b_elsewhere.n_eff == 0.0
    assert b_on_flaky_node.mean < b_elsewhere.mean - 0.3
    # the node fault did not touch the model's own rate
    assert estimate(snap, "a:v1", "n5", "fam", now, CONFIG).model_mean > 0.9


def test_hierarchy_off_uses_the_global_rate() -> None:
    config = SelectorConfig(hierarchy=False, fast_half_life_s=None)
    snap = feed(StatsSnapshot(), C3, ["ok"] * 100, config=config)
    snap = feed(snap, A1, ["node_fault"] * 10, start=10.0, config=config)
    a = estimate(snap, B1.model, B1.node, B1.family, 11.0, config)
    b = estimate(snap, B1.model, "n3", B1.family, 11.0, config)
    assert a.mean == b.mean


def test_wilson_bounds() -> None:
    low, high = wilson(19, 20, 1.645)
    assert low == pytest.approx(0.80, abs=0.01)
    assert wilson(950, 1000, 1.645)[0] == pytest.approx(0.937, abs=0.002)
    assert wilson(0, 0, 1.645) == (0.0, 1.0)
    assert high <= 1.0


def test_flat_codec_round_trips_str_and_bytes() -> None:
    snap = feed(StatsSnapshot(), A1, ["ok", "node_fault", "node_fault", "node_fault"])
    snap = feed(snap, B1, ["ok", "timeout"], start=1.0)
    flat = to_flat(snap)
    assert all(isinstance(v, float) and math.isfinite(v) for v in flat.values())
    assert f"{arm_key('a:v1', 'n1')}|quarantined" in flat
    assert from_flat(flat) == snap
    as_redis = {k.encode(): repr(v).encode() for k, v in flat.items()}
    assert from_flat(as_redis) == snap


def test_flat_codec_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not a snapshot field"):
        from_flat({"nofield": 1.0})
    with pytest.raises(ValueError, match="finite"):
        from_flat({"global|ok": "nan"})


def test_fast_window_restarts_the_long_counts_on_a_change() -> None:
    config = SelectorConfig(half_life_s=600.0, fast_half_life_s=15.0, level_changes=False)
    snap = feed(StatsSnapshot(), A1, ["ok"] * 300, step=0.2, config=config)
    before = estimate(snap, A1.model, A1.node, A1.family, 60.0, config)
    snap = feed(snap, A1, ["model_fault", "ok"] * 6, start=60.0, step=0.2, config=config)
    arm = snap.arms[A1.arm]
    after = estimate(snap, A1.model, A1.node, A1.family, 62.4, config)
    assert arm.changes >= 1
    assert before.mean > 0.99
    # without the fast window, 300 old successes keep the arm looking healthier
    slow = SelectorConfig(half_life_s=600.0, fast_half_life_s=None)
    snap2 = feed(StatsSnapshot(), A1, ["ok"] * 300, step=0.2, config=slow)
    snap2 = feed(snap2, A1, ["model_fault", "ok"] * 6, start=60.0, step=0.2, config=slow)
    assert after.mean < estimate(snap2, A1.model, A1.node, A1.family, 62.4, slow).mean - 0.03


def test_outcome_of_a_refusal_leaves_inflight_alone() -> None:
    snap = feed(StatsSnapshot(), A1, ["ok"])
    snap = record(snap, Outcome("a:v1", "n1", "fam", "deadline_too_short", dispatched=False),
                  1.0, CONFIG)
    assert snap.arms[A1.arm].inflight == 0


def test_a_model_change_on_one_node_discounts_its_arms_everywhere() -> None:
    def run(level_changes: bool) -> float:
        config = SelectorConfig(half_life_s=600.0, level_changes=level_changes)
        snap = StatsSnapshot()
        for i in range(150):
            snap = feed(snap, A1, ["ok"], start=i * 0.2, config=config)
            snap = feed(snap, A2, ["ok"], start=i * 0.2 + 0.1, config=config)
        # a minute later the model fails on n1; nothing recent says it still works on n2
        snap = feed(snap, A1, ["model_fault", "ok"] * 8, start=90.0, step=0.2, config=config)
        return estimate(snap, A2.model, A2.node, A2.family, 93.3, config).mean

    assert run(level_changes=False) > 0.99
    assert run(level_changes=True) < 0.97


def test_record_keys_name_the_siblings_a_change_point_rewrites() -> None:
    known = [A1.arm, A2.arm, B1.arm, C3.arm]
    keys = record_keys("a:v1", "n1", "fam", None, known)
    assert {A1.arm, A2.arm, B1.arm} <= set(keys)      # same model, or same node
    assert C3.arm not in keys
    assert {model_key("a:v1"), node_key("n1"), GLOBAL} <= set(keys)


def test_cusum_catches_a_sudden_drop_in_two_failures_and_restarts_from_them() -> None:
    # 99.9 % for a minute, then two failures: the 15 s window still holds ~70 successes,
    # so it would restart the counts looking healthy; the CUSUM restarts from the drop.
    def run(cusum_h: float | None) -> tuple[int, float]:
        config = SelectorConfig(half_life_s=600.0, level_changes=False, cusum_h=cusum_h,
                                change_min_n=1e9)    # the window test off: CUSUM alone
        snap = feed(StatsSnapshot(), A1, ["ok"] * 300, step=0.2, config=config)
        snap = feed(snap, A1, ["model_fault", "model_fault"], start=60.0, step=0.2,
                    config=config)
        arm = snap.arms[A1.arm]
        return arm.changes, estimate(snap, A1.model, A1.node, A1.family, 60.4, config).mean

    changes, mean = run(4.5)
    assert changes == 1
    assert mean < 0.9
    without_changes, without_mean = run(None)
    assert without_changes == 0
    assert without_mean > 0.98


def test_cusum_does_not_fire_on_the_usual_failures_of_a_steady_arm() -> None:
    # 99.5 % with failures spread out (one in 200): the sum falls back to zero between them
    config = SelectorConfig(half_life_s=300.0, level_changes=True)
    usual: list[Cause] = ["ok"] * 199
    usual.append("model_fault")
    causes = usual * 10
    snap = feed(StatsSnapshot(), A1, causes, step=0.2, config=config)
    assert snap.arms[A1.arm].changes == 0
    assert snap.level(model_key(A1.model)).cusum < 4.5


def test_a_slow_models_timeouts_fall_on_the_model_not_on_its_nodes() -> None:
    # B works on n1; then model a times out on n1 again and again. Split by how much each
    # already fails, the timeouts land on the model, and n1 stays a good node for b.
    def node_mean(split: bool) -> float:
        config = SelectorConfig(half_life_s=600.0, split_ambiguous=split, cusum_h=None,
                                fast_half_life_s=None)
        snap = feed(StatsSnapshot(), B1, ["ok"] * 100, config=config)
        slow: list[Cause] = ["ok"] * 20
        for _ in range(10):
            slow += ["timeout", "ok", "timeout"]
        snap = feed(snap, A1, slow, start=20.0, config=config)
        return Estimator(snap, 30.0, config).node_mean(B1.node)

    assert node_mean(split=False) < 0.87
    assert node_mean(split=True) > 0.95
