"""The figures of docs/routing.md §What each figure means for one run, from the simulator's
logs."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from bench.routing.sim import SLOTS, Sim
from bench.routing.world import Scenario

NAN = math.nan


def window_s(scenario: Scenario) -> float:
    """Share windows: 5 s, longer at low traffic so a window holds about 20 tasks."""
    return max(5.0, 20.0 / scenario.rate)


def share(dispatches: Sequence[tuple[float, str, int]], keys: set[str], start: float,
          end: float) -> float:
    """Share of attempts in [start, end) that went to `keys` (NaN: no attempts)."""
    n = hit = 0
    for t, key, _ in dispatches:
        if start <= t < end:
            n += 1
            hit += key in keys
    return hit / n if n else NAN


def bad_keys(scenario: Scenario) -> set[str]:
    return {a.key for a in scenario.all_arms() if scenario.is_bad(a)}


def first_window(dispatches: Sequence[tuple[float, str, int]], keys: set[str], start: float,
                 end: float, width: float, below: float | None = None,
                 above: float | None = None) -> float:
    """Seconds from `start` to the end of the first window whose share of `keys` is below
    (or at least) the threshold; NaN when no window in [start, end) qualifies."""
    t = start
    while t + width <= end + 1e-9:
        s = share(dispatches, keys, t, t + width)
        if not math.isnan(s) and (
                (below is not None and s < below) or (above is not None and s >= above)):
            return t + width - start
        t += width
    return NAN


def run_metrics(sim: Sim, oracle: Sim | None) -> dict[str, float]:
    """Every per-run figure; times in seconds, shares and rates as fractions."""
    sc = sim.scenario
    tasks = sim.tasks
    n = len(tasks)
    ok = sum(t.ok for t in tasks)
    first_ok = sum(t.first_ok for t in tasks)
    out: dict[str, float] = {
        "tasks": n, "success": ok / n, "first_success": first_ok / n,
        "successes": ok, "first_successes": first_ok,
        "failed_per_10k": 1e4 * (n - ok) / n,
        "attempts_per_task": sum(t.attempts for t in tasks) / n,
        "peak_retry_concurrency": sim.peak_retrying,
        "deadline_miss": sum(t.missed_deadline for t in tasks) / n,
        "flaps_per_h": sim.router.flaps * 3600.0 / sc.duration,
        "panics": sim.router.panics,
        "rejects": sim.rejects,
        "max_util": sim.max_active / SLOTS,
    }
    lat = np.array([t.finished - t.arrival for t in tasks if t.ok])
    for q in (50, 95, 99):
        out[f"latency_p{q}"] = float(np.percentile(lat, q)) if lat.size else NAN
    ns = np.array(sim.decision_ns, dtype=float) / 1000.0
    out["us_p50"] = float(np.percentile(ns, 50)) if ns.size else NAN
    out["us_p99"] = float(np.percentile(ns, 99)) if ns.size else NAN

    for key in ("incident_success", "incident_first_success", "bad_share", "detect_s",
                "recover_s", "new_version_attempts", "new_version_half_share_s"):
        out[key] = NAN
    if sc.incident is not None:
        start, end = sc.incident
        inc = [t for t in tasks if start <= t.arrival < end]
        if inc:
            out["incident_success"] = sum(t.ok for t in inc) / len(inc)
            out["incident_first_success"] = sum(t.first_ok for t in inc) / len(inc)
        bad = bad_keys(sc)
        everything = {a.key for a in sc.all_arms()}
        if bad and bad != everything:
            out["bad_share"] = share(sim.dispatches, bad, start, end)
            out["detect_s"] = first_window(sim.dispatches, bad, start, end, window_s(sc),
                                           below=0.05)
            if sc.recovers and oracle is not None:
                ref = share(oracle.dispatches, bad, end, sc.duration)
                if ref >= 0.05:
                    out["recover_s"] = first_window(sim.dispatches, bad, end, sc.duration,
                                                    window_s(sc), above=0.5 * ref)
    if sc.new_version is not None:
        v2 = {a.key for a in sc.all_arms() if a.model == sc.new_version}
        out["new_version_attempts"] = sum(1 for _, k, _ in sim.dispatches if k in v2)
        if not sc.fault and oracle is not None:
            added = min(a.added_at for a in sc.extra_arms)
            ref = share(oracle.dispatches, v2, added, sc.duration)
            if ref >= 0.05:
                out["new_version_half_share_s"] = first_window(
                    sim.dispatches, v2, added, sc.duration, window_s(sc), above=0.5 * ref)
    return out
