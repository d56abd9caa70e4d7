"""The routing simulator runs the production selector unchanged, deterministically."""

from __future__ import annotations

import math

from bench.routing.runner import Job, run_job


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def test_one_seed_of_one_scenario_is_deterministic() -> None:
    job = Job("low_traffic", 3, ("selector", "round_robin"), ())
    first = run_job(job)
    again = run_job(job)
    strip = ("us_p50", "us_p99")
    for policy in ("selector", "round_robin", "oracle"):
        a, b = first[2][policy], again[2][policy]
        assert all(same(a[k], b[k]) for k in a if k not in strip)
    sel, rr = first[2]["selector"], first[2]["round_robin"]
    # model B at 50 % on every node (1 task/s): the selector moves away, round robin does not
    assert sel["bad_share"] < 0.1 < rr["bad_share"]
    assert sel["incident_first_success"] > rr["incident_first_success"]
