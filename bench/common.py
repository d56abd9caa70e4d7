"""What every benchmark shares: the percentile and spread its figures use, and a clean exit on
SIGTERM."""

from __future__ import annotations

import signal
import statistics
from collections.abc import Iterable, Sequence
from typing import TypedDict


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of a non-empty sequence."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


class Spread(TypedDict):
    p50: float | None
    p99: float | None
    max: float | None


def spread(values: Iterable[float]) -> Spread:
    """Median, p99 and maximum of a sample, rounded to 10 ms (None each for no sample)."""
    listed = list(values)
    if not listed:
        return {"p50": None, "p99": None, "max": None}
    return {"p50": round(statistics.median(listed), 2),
            "p99": round(percentile(listed, 0.99), 2), "max": round(max(listed), 2)}


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(143)


def exit_cleanly_on_sigterm() -> None:
    """Turn SIGTERM (e.g. from `timeout`) into SystemExit, so `finally` blocks stop the
    services, fleets and consumers a benchmark started."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
