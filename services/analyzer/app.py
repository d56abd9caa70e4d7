"""Analyzer wiring: `faststream run services.analyzer.app:create_app --factory`."""

from __future__ import annotations

from faststream import FastStream

from schemas.events.v1 import NodeState, SampleBatch
from schemas.topics import Topic, topic_name
from services.analyzer.handlers import Analyzer
from services.analyzer.needs import enabled
from services.analyzer.settings import AnalyzerSettings
from services.analyzer.store import AnalyzerStore, PoolStore
from services.shared.messaging import (
    EventBus,
    consumer_options,
    group_name,
    make_broker,
    strict_decoder,
)
from services.shared.redis_client import Keys, connect_redis
from services.shared.runtime import build_app
from services.shared.telemetry import setup_telemetry


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
        PoolStore(redis, keys),
        EventBus(broker, settings.namespace),
        keys,
    )
    limit = settings.max_message_bytes
    # One consumer group per topic, so a rebalance on one topic never pauses the other.
    broker.subscriber(
        topic_name(Topic.OPS_SAMPLES, settings.namespace),
        # A batch of up to 2,000 samples is larger than one event.
        decoder=strict_decoder(SampleBatch, 2 * 1024 * 1024),
        **consumer_options(group_name(settings, "analyzer-samples")),
    )(analyzer.on_samples)
    broker.subscriber(
        topic_name(Topic.OPS_NODE_STATE, settings.namespace),
        decoder=strict_decoder(NodeState, limit),
        **consumer_options(group_name(settings, "analyzer-node-state")),
    )(analyzer.on_node_state)
    return build_app(
        broker, settings,
        loops=[("pool-analysis", settings.pool_period_s, analyzer.analyze_pools)],
        closers=[redis.aclose],
    )
