"""Collector wiring: `faststream run services.collector.app:create_app --factory`."""

from __future__ import annotations

from typing import Any

from faststream import FastStream
from faststream.message import StreamMessage

from schemas.topics import Topic, topic_name
from services.collector.handlers import Collector
from services.collector.settings import CollectorSettings
from services.collector.store import NodeStore
from services.shared.messaging import BulkPublisher, consumer_options, group_name, make_broker
from services.shared.redis_client import Keys, connect_redis
from services.shared.runtime import build_app
from services.shared.telemetry import setup_telemetry


async def raw_bodies(msg: StreamMessage[Any]) -> Any:
    """Leave the bytes alone: each report in a batch is validated on its own."""
    return msg.body


def create_app(settings: CollectorSettings | None = None) -> FastStream:
    settings = settings or CollectorSettings()
    telemetry = setup_telemetry("collector")
    broker, dead_letters = make_broker(settings, "collector", telemetry)
    redis = connect_redis(settings.redis_url)
    tracer = telemetry.tracer("clusterwarden.collector")
    bulk = BulkPublisher(settings.kafka_bootstrap_servers, settings.namespace,
                         "warden-collector-bulk", tracer)
    collector = Collector(
        settings,
        NodeStore(redis, Keys(settings.namespace), settings.require_registration,
                  settings.history_minutes),
        bulk,
        dead_letters,
        tracer,
        telemetry.meter("clusterwarden.collector"),
    )
    broker.subscriber(
        topic_name(Topic.NODE_REPORTS, settings.namespace),
        batch=True,
        max_records=settings.batch_max_records,
        decoder=raw_bodies,
        **consumer_options(group_name(settings, "collector")),
    )(collector.on_reports)
    return build_app(
        broker,
        settings,
        loops=[("heartbeat-sweep", settings.sweep_interval_s, collector.sweep_heartbeats)],
        starters=[bulk.start],
        closers=[bulk.stop, redis.aclose],
    )
