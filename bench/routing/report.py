"""Aggregate per-seed figures: means with 95 % CIs, medians of times, paired Wilcoxon tests
against the best baseline, and the markdown tables of docs/routing.md."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

import numpy as np
from scipy import stats as sps

from bench.routing.runner import ORACLE, PRODUCTION

# Figures reported as mean +- 95 % CI (shares shown as %).
PERCENT = ("success", "first_success", "incident_success", "incident_first_success",
           "bad_share", "deadline_miss")
MEANS = ("failed_per_10k", "attempts_per_task", "peak_retry_concurrency", "flaps_per_h",
         "panics", "rejects", "max_util", "latency_p50", "latency_p95", "latency_p99",
         "us_p50", "us_p99", "new_version_attempts")
# Times: median over the seeds where the event happened, and how many did.
TIMES = ("detect_s", "recover_s", "new_version_half_share_s")
# Figures where higher is better, for "best baseline".
KEY = ("first_success", "incident_first_success", "success", "incident_success")


Interval = tuple[float, float]   # a mean and the half-width of its 95 % t-interval
Median = tuple[float, int]       # a median and how many seeds it is over
# One policy in one scenario: "seeds", then every figure above by name.
PolicyRow = dict[str, int | Interval | Median]


class Comparison(TypedDict):
    """The selector against the best baseline on one figure."""

    best_baseline: str
    selector: float
    baseline: float
    diff_pp: float
    p_wilcoxon: float


class ScenarioSummary(TypedDict):
    policies: dict[str, PolicyRow]
    compare: dict[str, Comparison]


Summary = dict[str, ScenarioSummary]


def interval(row: PolicyRow, key: str) -> Interval:
    """A mean-and-CI figure of `row`."""
    value = row[key]
    if isinstance(value, int):
        raise TypeError(f"{key} is a count, not a figure")
    return value


def median(row: PolicyRow, key: str) -> Median:
    """A median-and-count figure of `row`."""
    value = row[key]
    if isinstance(value, int) or not isinstance(value[1], int):
        raise TypeError(f"{key} is not a median with its count")
    return value[0], value[1]


def seeds_of(row: PolicyRow) -> int:
    value = row["seeds"]
    if not isinstance(value, int):
        raise TypeError("seeds is not a count")
    return value


def is_baseline(policy: str) -> bool:
    return policy not in (ORACLE, PRODUCTION) and not policy.startswith(PRODUCTION)


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of its 95 % t-interval (NaN values dropped)."""
    v = np.array([x for x in values if not math.isnan(x)], dtype=float)
    if v.size == 0:
        return math.nan, math.nan
    if v.size == 1:
        return float(v[0]), math.nan
    half = float(sps.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
    return float(v.mean()), half


def median_count(values: Sequence[float]) -> tuple[float, int]:
    v = [x for x in values if not math.isnan(x)]
    return (float(np.median(v)) if v else math.nan), len(v)


def wilcoxon(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided paired Wilcoxon signed-rank p-value (1.0 when every pair is equal)."""
    d = np.array(a, dtype=float) - np.array(b, dtype=float)
    d = d[~np.isnan(d)]
    if d.size == 0 or not np.any(d != 0.0):
        return 1.0
    return float(sps.wilcoxon(d, zero_method="wilcox").pvalue)


def summarise(results: dict[str, dict[str, list[dict[str, float]]]]) -> Summary:
    """Per scenario and policy: every figure aggregated; per scenario: the comparison."""
    out: Summary = {}
    for scenario, per in results.items():
        agg: dict[str, PolicyRow] = {}
        for policy, runs in per.items():
            row: PolicyRow = {"seeds": len(runs)}
            for k in PERCENT + MEANS:
                row[k] = mean_ci([r[k] for r in runs])
            for k in TIMES:
                row[k] = median_count([r[k] for r in runs])
            oracle = per.get(ORACLE)
            if oracle:
                row["regret"] = mean_ci([o["successes"] - r["successes"]
                                         for o, r in zip(oracle, runs, strict=True)])
                row["regret_first"] = mean_ci([o["first_successes"] - r["first_successes"]
                                               for o, r in zip(oracle, runs, strict=True)])
            agg[policy] = row
        compare: dict[str, Comparison] = {}
        if PRODUCTION in per:
            for k in KEY:
                base = [p for p in per if is_baseline(p)
                        and not math.isnan(interval(agg[p], k)[0])]
                if not base or math.isnan(interval(agg[PRODUCTION], k)[0]):
                    continue
                best = max(base, key=lambda p: interval(agg[p], k)[0])
                mine = [r[k] for r in per[PRODUCTION]]
                theirs = [r[k] for r in per[best]]
                selector, baseline = interval(agg[PRODUCTION], k)[0], interval(agg[best], k)[0]
                compare[k] = {
                    "best_baseline": best,
                    "selector": selector, "baseline": baseline,
                    "diff_pp": 100.0 * (selector - baseline),
                    "p_wilcoxon": wilcoxon(mine, theirs),
                }
        out[scenario] = {"policies": agg, "compare": compare}
    return out


def _pct(x: tuple[float, float], digits: int = 2) -> str:
    m, h = x
    if math.isnan(m):
        return "-"
    if math.isnan(h):
        return f"{100 * m:.{digits}f}"
    return f"{100 * m:.{digits}f} ± {100 * h:.{digits}f}"


def _num(x: tuple[float, float], digits: int = 1) -> str:
    m, h = x
    if math.isnan(m):
        return "-"
    if math.isnan(h):
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {h:.{digits}f}"


def _time(x: tuple[float, int], seeds: int) -> str:
    m, n = x
    if n == 0:
        return "-"
    return f"{m:.0f} ({n}/{seeds})"


def gap_table(summary: Summary) -> list[str]:
    """Each router's gap to the oracle in first-attempt success (pp): mean over the
    scenarios, its worst scenario, and its worst incident window."""
    gaps: dict[str, list[tuple[float, str]]] = {}
    incident: dict[str, list[tuple[float, str]]] = {}
    for scenario, data in summary.items():
        rows = data["policies"]
        if "oracle" not in rows:
            continue
        for policy, row in rows.items():
            if policy == "oracle":
                continue
            gap = 100 * (interval(rows["oracle"], "first_success")[0]
                         - interval(row, "first_success")[0])
            gaps.setdefault(policy, []).append((gap, scenario))
            o_inc = interval(rows["oracle"], "incident_first_success")[0]
            r_inc = interval(row, "incident_first_success")[0]
            if not (math.isnan(o_inc) or math.isnan(r_inc)):
                incident.setdefault(policy, []).append((100 * (o_inc - r_inc), scenario))
    lines = ["### Gap to the oracle in first-attempt success, over every scenario", "",
             "| router | mean gap (pp) | worst scenario (pp) | worst incident-window gap (pp) |",
             "|---|---|---|---|"]
    for policy, values in sorted(gaps.items(), key=lambda kv: sum(g for g, _ in kv[1])
                                 / len(kv[1])):
        worst = max(values)
        worst_inc = max(incident.get(policy, [(math.nan, "-")]))
        lines.append(f"| {policy} | {sum(g for g, _ in values) / len(values):.2f} | "
                     f"{worst[0]:.2f} ({worst[1]}) | {worst_inc[0]:.2f} ({worst_inc[1]}) |")
    return lines


def markdown(summary: Summary, descriptions: dict[str, str]) -> str:
    """The comparison table, then one table per scenario."""
    lines = ["### Selector against the best baseline (first-attempt and incident-window)", "",
             "| scenario | figure | selector % | best baseline | baseline % | diff (pp) | "
             "p (Wilcoxon) |", "|---|---|---|---|---|---|---|"]
    for scenario, data in summary.items():
        for k in ("first_success", "incident_first_success", "success", "incident_success"):
            c = data["compare"].get(k)
            if not c:
                continue
            lines.append(f"| {scenario} | {k} | {100 * c['selector']:.2f} | "
                         f"{c['best_baseline']} | {100 * c['baseline']:.2f} | "
                         f"{c['diff_pp']:+.2f} | {c['p_wilcoxon']:.2g} |")
    lines += ["", *gap_table(summary)]
    for scenario, data in summary.items():
        lines += ["", f"### {scenario}: {descriptions.get(scenario, '')}", "",
                  "| policy | end-to-end % | first-attempt % | incident e2e % | "
                  "incident first % | regret (tasks) | detect s | recover s | bad-arm % | "
                  "attempts/task | p99 latency s | deadline miss % | flaps/h | "
                  "panic/no-target | rejects | µs/decision p50 |",
                  "|---|" + "---|" * 15]
        for policy, row in data["policies"].items():
            seeds = seeds_of(row)
            regret = interval(row, "regret") if "regret" in row else (math.nan, math.nan)
            lines.append(
                f"| {policy} | {_pct(interval(row, 'success'))} | "
                f"{_pct(interval(row, 'first_success'))} | "
                f"{_pct(interval(row, 'incident_success'))} | "
                f"{_pct(interval(row, 'incident_first_success'))} | {_num(regret)} | "
                f"{_time(median(row, 'detect_s'), seeds)} | "
                f"{_time(median(row, 'recover_s'), seeds)} | "
                f"{_pct(interval(row, 'bad_share'), 1)} | "
                f"{_num(interval(row, 'attempts_per_task'), 3)} | "
                f"{_num(interval(row, 'latency_p99'), 2)} | "
                f"{_pct(interval(row, 'deadline_miss'))} | "
                f"{_num(interval(row, 'flaps_per_h'), 0)} | {_num(interval(row, 'panics'), 1)} | "
                f"{_num(interval(row, 'rejects'), 1)} | {_num(interval(row, 'us_p50'), 1)} |")
        nv = [(p, r) for p, r in data["policies"].items()
              if not math.isnan(interval(r, "new_version_attempts")[0])]
        if nv:
            lines += ["", "| policy | attempts sent to the new version | time to 50 % of its "
                      "oracle share (s) |", "|---|---|---|"]
            for p, r in nv:
                lines.append(f"| {p} | {_num(interval(r, 'new_version_attempts'), 0)} | "
                             f"{_time(median(r, 'new_version_half_share_s'), seeds_of(r))} |")
    return "\n".join(lines) + "\n"
