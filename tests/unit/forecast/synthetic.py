"""Synthetic utilisation series with a known trend and daily cycle, for the forecast tests."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

NOW = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def truth(at: datetime, level: float = 50.0, slope_per_h: float = 0.02,
          amplitude: float = 10.0) -> float:
    """The noise-free value at `at`: a straight trend plus a daily sine (peak at 06:00 UTC)."""
    hours = (at - NOW) / HOUR
    return level + slope_per_h * hours + amplitude * math.sin(2 * math.pi * at.hour / 24)


def hourly(days: float, *, noise: float = 1.0, seed: int = 1, end: datetime = NOW,
           **shape: float) -> list[tuple[datetime, float]]:
    """`days` of hourly samples ending just before `end`, with Gaussian noise (seeded)."""
    rng = random.Random(seed)
    count = round(days * 24)
    return [(at, truth(at, **shape) + rng.gauss(0.0, noise))
            for at in (end - (count - i) * HOUR for i in range(count))]
