"""The capacity forecast and report, from services.forecast when it is there (imported lazily).

The forecast is advice shown to operators: when its module is missing, or it cannot fit the
history, the capacity page still shows the history and the band, and says why there is no
forecast. A fit costs up to a few seconds of CPU, so it runs off the event loop and its result
is kept for `API_FORECAST_TTL_S` per pool (the forecast is hourly: a minute changes nothing).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from redis.asyncio import Redis

from schemas.ranges import BandArgs
from services.api.cluster import ClusterReader, HistoryPoint, Resolution
from services.executor.cluster_view import ClusterView
from services.shared.redis_client import Keys

log = logging.getLogger("clusterwarden.api")
# The forecast fits at most 8 weeks; the analyzer keeps a week of minutes and a year of hours.
FIT_SPAN: Final = timedelta(days=56)
MINUTES_KEPT: Final = 10_080


@dataclass(frozen=True)
class Outlook:
    """The forecast and the capacity report as JSON, or why there are none."""

    forecast: dict[str, Any] | None = None
    capacity: dict[str, Any] | None = None
    error: str | None = None
    fresh: bool = False  # computed by this call (not from the cache): its proposal is new


@dataclass
class ForecastCache:
    ttl_s: float
    entries: dict[tuple[str, str], tuple[float, Outlook]] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def fit_series(hours: list[HistoryPoint],
               minutes: list[HistoryPoint]) -> list[tuple[datetime, float]]:
    """The hourly history up to where the minute history starts, then the minutes."""
    start = minutes[0].at if minutes else None
    older = [(p.at, p.util_pct) for p in hours if start is None or p.at < start]
    return older + [(p.at, p.util_pct) for p in minutes]


async def outlook(reader: ClusterReader, redis: Redis, keys: Keys, cache: ForecastCache,
                  cluster: str, pool: str, band: BandArgs, now: datetime) -> Outlook:
    """The pool's forecast and capacity report (cached for `cache.ttl_s`)."""
    key = (cluster, pool)
    async with cache.lock:  # one fit per pool at a time; the others wait for its result
        cached = cache.entries.get(key)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        result = await _compute(reader, redis, keys, cluster, pool, band, now)
        cache.entries[key] = (time.monotonic() + cache.ttl_s, result)
        return dataclasses.replace(result, fresh=True)


async def _compute(reader: ClusterReader, redis: Redis, keys: Keys, cluster: str, pool: str,
                   band: BandArgs, now: datetime) -> Outlook:
    try:
        module = importlib.import_module("services.forecast")
        forecast_utilisation = module.forecast_utilisation
        capacity_report = module.capacity_report
    except (ImportError, AttributeError) as err:
        return Outlook(error=f"forecast unavailable: {err}")
    hours = await reader.pool_history(cluster, pool, Resolution.HOUR,
                                      int(FIT_SPAN / timedelta(hours=1)))
    minutes = await reader.pool_history(cluster, pool, Resolution.MINUTE, MINUTES_KEPT)
    series = fit_series(hours, minutes)
    view = await ClusterView(redis, keys).pool(cluster, pool)
    gpus = sum(n.gpus for n in view.nodes)
    nodes_now = len(view.nodes)
    try:
        # Model fits are CPU work: off the event loop, so other requests are still served.
        forecast = await asyncio.to_thread(forecast_utilisation, series, now)
        report = capacity_report(forecast, band, nodes_now,
                                 per_node_capacity=gpus / nodes_now if nodes_now else 1.0,
                                 capacity_now=float(gpus))
    except Exception as err:
        log.info("no forecast for %s/%s: %r", cluster, pool, err)
        return Outlook(error=f"no forecast: {err}")
    return Outlook(forecast=forecast.model_dump(mode="json"),
                   capacity=report.model_dump(mode="json"))
