"""Analyzer wiring: `faststream run services.analyzer.app:create_app --factory`."""

from __future__ import annotations

from faststream import FastStream

from common.messaging import EventBus, make_broker, subscribe
from common.telemetry import setup_telemetry
from schemas.topics import Topic
from services.analyzer.handlers import Analyzer
from services.analyzer.needs import enabled
from services.analyzer.settings import AnalyzerSettings
from services.analyzer.store import AnalyzerStore, PoolStore
from services.shared.redis_client import Keys, connect_redis
from services.shared.runtime import build_app


def create_app(settings: AnalyzerSettings | None = None) -> FastStream:
    settings = settings or AnalyzerSettings()
    telemetry = setup_telemetry("analyzer")
    broker, _ = make_broker(settings, "analyzer", telemetry)
    redis = connect_redis(settings.redis_url)
    keys = Keys(settings.namespace)
    analyzer = Analyzer(
        settings,
        enabled(settings.enabled_needs),
        AnalyzerStore(redis, keys),
        PoolStore(redis, keys, settings.storage_weight),
        EventBus(broker, settings.namespace),
        keys,
    )
    # One consumer group per topic, so a rebalance on one topic never pauses the other.
    # A batch of up to 2,000 samples is larger than one event.
    subscribe(broker, settings, Topic.OPS_SAMPLES, "analyzer-samples", analyzer.on_samples,
              limit=2 * 1024 * 1024)
    subscribe(broker, settings, Topic.OPS_NODE_STATE, "analyzer-node-state",
              analyzer.on_node_state)
    return build_app(
        broker, settings,
        loops=[("pool-analysis", settings.pool_period_s, analyzer.analyze_pools)],
        closers=[redis.aclose],
    )
