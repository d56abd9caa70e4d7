"""Capacity-plan backtest against persistence on the real traces (bench/traces/README.md).

What is scored is what the plan is made of: its forecast of each day's peak, `h` days ahead,
with its 80 % and 95 % intervals (services/forecast/planning.py: daily history, peak
uplift, daily ETS forecast, peak per day). Rolling origins: at each origin day the plan sees
only the history before it.

Series (both real; nothing synthetic):
* Philly: the per-minute busy-node share of Microsoft's Philly cluster (2017-10-03 to
  2017-12-15), as hourly means; a day's actual peak is its busiest hour. 73 days: origins
  from day 28, horizons up to 14 days.
* Titan: ORNL Titan's GPU failures (2014-2019, 18,687 GPU slots), as the GPUs that failed
  in the trailing 28 days, daily: the replacement demand a procurement plan must cover
  (in GPUs, not %: the plan's math takes any non-negative series). No hourly history:
  the plan's daily-only path (no uplift). Origins every 14 days from 2015-01-01, horizons
  up to 91 days.

Baseline: persistence, "every day ahead = the last day" (the last day's peak), with the
random-walk interval sigma * sqrt(h) from the history's day-to-day changes.

Metrics per horizon: MAE (Philly: % points; Titan: GPUs) and coverage of the 80 % and 95 %
intervals.

Run: `python -m bench.capacity_plan` (`--quick` for a few origins, as the unit tests do).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from statistics import NormalDist

import numpy as np

from bench.forecast import DEFAULT_TRACES, PHILLY_FILE, hourly_actuals, read_series
from services.forecast.planning import daily_history, forecast_days, peak_uplift

TITAN_FILE = "titan_gpu/titan_gpu_failure_events_derived.csv"
DAY = timedelta(days=1)
Z = {80: NormalDist().inv_cdf(0.90), 95: NormalDist().inv_cdf(0.975)}


@dataclass(frozen=True)
class Series:
    """A trace as the plan sees it: hourly values (maybe none), daily values, daily actual
    peaks (what is scored), and the backtest's origins and horizons."""

    name: str
    hourly: list[tuple[datetime, float]]
    daily: list[tuple[datetime, float]]
    peaks: dict[datetime, float]
    origins: list[datetime]
    horizons: tuple[int, ...]


@dataclass
class Score:
    errors: list[float]
    in80: list[bool]
    in95: list[bool]

    def row(self) -> dict[str, float | int]:
        return {"n": len(self.errors), "mae": round(statistics.fmean(self.errors), 3),
                "coverage_80": round(statistics.fmean(self.in80), 3),
                "coverage_95": round(statistics.fmean(self.in95), 3)}


def philly(traces: Path, quick: bool) -> Series:
    hours = hourly_actuals(read_series(traces / PHILLY_FILE))
    hourly = sorted(hours.items())
    peaks: dict[datetime, float] = {}
    for at, value in hourly:
        day = at.replace(hour=0)
        peaks[day] = max(peaks.get(day, -math.inf), value)
    days = sorted(peaks)
    origins = days[28:-1:7 if quick else 1][: 2 if quick else None]
    return Series("philly", hourly, [], peaks, origins, (1, 7, 14))


def titan(traces: Path, quick: bool) -> Series:
    with (traces / TITAN_FILE).open(newline="") as handle:
        failed = [datetime.fromisoformat(r["event_time"]).replace(tzinfo=UTC)
                  for r in csv.DictReader(handle)]
    first = min(failed).replace(hour=0, minute=0, second=0)
    last = max(failed).replace(hour=0, minute=0, second=0)
    per_day: dict[datetime, int] = {}
    for at in failed:
        per_day[at.replace(hour=0, minute=0, second=0, microsecond=0)] = per_day.get(
            at.replace(hour=0, minute=0, second=0, microsecond=0), 0) + 1
    counts = [per_day.get(first + i * DAY, 0) for i in range((last - first) // DAY + 1)]
    window = np.convolve(np.array(counts, dtype=np.float64), np.ones(28), mode="full")
    daily = [(first + i * DAY, float(window[i]))
             for i in range(27, len(counts))]
    peaks = dict(daily)
    start = datetime(2015, 1, 1, tzinfo=UTC)
    origins = [d for d, _ in daily if d >= start and (d - start).days % 14 == 0
               and d + 91 * DAY <= daily[-1][0]]
    return Series("titan", [], daily, peaks, origins[:2] if quick else origins, (7, 28, 91))


def _persistence(history_peaks: Sequence[float], h: int) -> tuple[float, float]:
    """Last day's peak, and the random-walk sigma for `h` days ahead."""
    diffs = np.diff(np.array(history_peaks, dtype=np.float64))
    sigma = float(np.std(diffs, ddof=1)) if diffs.size >= 2 else 0.0
    return float(history_peaks[-1]), sigma * math.sqrt(h)


def backtest(series: Series) -> dict[str, object]:
    """Both methods on every origin and horizon of `series`."""
    plan = {h: Score([], [], []) for h in series.horizons}
    base = {h: Score([], [], []) for h in series.horizons}
    seconds: list[float] = []
    longest = max(series.horizons)
    for origin in series.origins:
        hourly = [p for p in series.hourly if p[0] < origin]
        daily = [p for p in series.daily if p[0] < origin]
        started = time.perf_counter()
        history = daily_history(hourly, daily, origin)
        if history is None or history.days < 14:
            continue
        uplift = peak_uplift(history) or 0.0
        ahead = forecast_days(history, longest).fitted
        seconds.append(time.perf_counter() - started)
        past = [series.peaks[d] for d in sorted(series.peaks) if d < origin]
        for h in series.horizons:
            actual = series.peaks.get(origin + (h - 1) * DAY)
            if actual is None:
                continue
            i = (origin - history.start) // DAY - history.days + h - 1
            mean = float(ahead.mean[i]) + uplift
            _score(plan[h], actual, mean,
                   {80: (float(ahead.lower_80[i]) + uplift, float(ahead.upper_80[i]) + uplift),
                    95: (float(ahead.lower_95[i]) + uplift, float(ahead.upper_95[i]) + uplift)})
            last, spread = _persistence(past, h)
            _score(base[h], actual, last,
                   {k: (last - z * spread, last + z * spread) for k, z in Z.items()})
    return {
        "series": series.name, "origins": len(series.origins),
        "plan": {f"{h}d": plan[h].row() for h in series.horizons if plan[h].errors},
        "persistence": {f"{h}d": base[h].row() for h in series.horizons if base[h].errors},
        "seconds_per_plan": round(statistics.fmean(seconds), 3) if seconds else None,
    }


def _score(score: Score, actual: float, mean: float,
           bounds: dict[int, tuple[float, float]]) -> None:
    score.errors.append(abs(mean - actual))
    score.in80.append(bounds[80][0] <= actual <= bounds[80][1])
    score.in95.append(bounds[95][0] <= actual <= bounds[95][1])


def run(traces: Path = DEFAULT_TRACES, quick: bool = False) -> dict[str, object]:
    return {
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, "
                   f"Python {sys.version.split()[0]}",
        "quick": quick,
        "results": [backtest(philly(traces, quick)), backtest(titan(traces, quick))],
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--quick", action="store_true", help="two origins per trace")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.traces, args.quick), indent=2))


if __name__ == "__main__":
    main()
