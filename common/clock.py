"""The clocks ClusterWarden's components take instead of reading the time themselves.

A handler or store that decides on the time gets a clock at construction, so a test sets the
time it runs at instead of waiting for it or bracketing the wall clock. Production uses the
defaults: `now_utc` for a `Clock`, `time.time` for an `EpochClock`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

Clock = Callable[[], datetime]
"""The current time, aware, in UTC."""

EpochClock = Callable[[], float]
"""The current time in epoch seconds: for stores that keep times as numbers in Redis."""


def epoch_ms(moment: datetime) -> int:
    """A moment as Redis keeps times in scores and counters: epoch milliseconds."""
    return int(moment.timestamp() * 1000)
