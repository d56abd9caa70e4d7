"""What every benchmark shares: the percentile its figures use, and a clean exit on SIGTERM."""

from __future__ import annotations

import signal
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of a non-empty sequence."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(143)


def exit_cleanly_on_sigterm() -> None:
    """Turn SIGTERM (e.g. from `timeout`) into SystemExit, so `finally` blocks stop the
    services, fleets and consumers a benchmark started."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
