"""Inventory wiring: `faststream run services.inventory.app:create_app --factory`.

Its own service rather than a loop in the executor or the analyzer: it holds a list + watch
of every Kubernetes cluster's nodes and pods (memory and API server connections the size of
the clusters), which the analyzer's fault path should not carry, and the executor scales by
instances that would each watch every cluster again. It consumes no topic: one loop reports
the pending jobs of each cluster as queued demand in Redis (reporter.py).
"""

from __future__ import annotations

from faststream import FastStream

from common.health import checks
from common.messaging import make_broker
from common.telemetry import setup_telemetry
from services.backends.opened import OpenedBackends
from services.inventory.reporter import DemandReporter
from services.inventory.settings import InventorySettings
from services.shared.redis_client import Keys, connect_redis
from services.shared.runtime import build_app


def create_app(settings: InventorySettings | None = None) -> FastStream:
    settings = settings or InventorySettings()
    telemetry = setup_telemetry("inventory")
    broker, _ = make_broker(settings, "inventory", telemetry)
    redis = connect_redis(settings.redis_url, settings.redis_connect_timeout_s,
                          settings.redis_read_timeout_s)
    keys = Keys(settings.namespace)
    backends = OpenedBackends(redis, keys)
    reporter = DemandReporter(redis, keys, backends, period_s=settings.period_s,
                              ttl_s=settings.period_s * settings.ttl_periods)
    return build_app(broker, settings,
                     loops=[("pending-jobs", settings.period_s, reporter.tick)],
                     closers=[backends.close, redis.aclose],
                     dependencies=[checks.redis(redis)])
