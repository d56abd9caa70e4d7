"""Analyzer wiring: `faststream run services.analyzer.app:create_app --factory`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from faststream import FastStream

from common.health import checks
from common.messaging import EventBus, make_broker, subscribe
from common.telemetry import setup_telemetry
from schemas.topics import Topic
from services.analyzer.handlers import Analyzer
from services.analyzer.needs import enabled
from services.analyzer.planning import planner_for
from services.analyzer.settings import AnalyzerSettings
from services.analyzer.store import AnalyzerStore, PoolStore
from services.shared.outbox import outbox_period_s
from services.shared.redis_client import Keys, connect_redis
from services.shared.runtime import build_app


def create_app(settings: AnalyzerSettings | None = None) -> FastStream:
    settings = settings or AnalyzerSettings()
    telemetry = setup_telemetry("analyzer")
    broker, _ = make_broker(settings, "analyzer", telemetry)
    redis = connect_redis(settings.redis_url, settings.redis_connect_timeout_s,
                          settings.redis_read_timeout_s)
    keys = Keys(settings.namespace)
    pools = PoolStore(redis, keys, settings.storage_weight)
    bus = EventBus(broker, settings.namespace)
    analyzer = Analyzer(
        settings,
        enabled(settings.enabled_needs),
        AnalyzerStore(redis, keys),
        pools,
        bus,
        keys,
    )
    # One consumer group per topic, so a rebalance on one topic never pauses the other.
    # A batch of up to 2,000 samples is larger than one event.
    subscribe(broker, settings, Topic.OPS_SAMPLES, "analyzer-samples", analyzer.on_samples,
              limit=2 * 1024 * 1024)
    subscribe(broker, settings, Topic.OPS_NODE_STATE, "analyzer-node-state",
              analyzer.on_node_state)
    loops = [("pool-analysis", settings.pool_period_s, analyzer.analyze_pools),
             ("outbox-relay", outbox_period_s(settings), analyzer.relay_outbox)]
    closers: list[Callable[[], Awaitable[None]]] = [redis.aclose]
    if settings.planning.enabled:
        planner = planner_for(settings, pools, bus)
        loops.append(("capacity-planning", settings.planning.period_s, planner.tick))
        closers.append(planner.close)
    return build_app(broker, settings, loops=loops, closers=closers,
                     dependencies=[checks.redis(redis)])
