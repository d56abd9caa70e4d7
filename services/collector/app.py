"""Collector wiring: `faststream run services.collector.app:create_app --factory`."""

from __future__ import annotations

from faststream import FastStream

from schemas.events.v1 import CommandResult
from schemas.topics import Topic, topic_name
from services.collector.handlers import Collector, Prober
from services.collector.settings import CollectorSettings
from services.collector.store import NodeStore, ProbeStore
from services.shared.messaging import (
    BulkPublisher,
    EventBus,
    consumer_options,
    group_name,
    make_broker,
    raw_bodies,
    strict_decoder,
)
from services.shared.redis_client import Keys, connect_redis
from services.shared.runtime import build_app
from services.shared.signing import local_signer
from services.shared.telemetry import setup_telemetry


def create_app(settings: CollectorSettings | None = None) -> FastStream:
    settings = settings or CollectorSettings()
    telemetry = setup_telemetry("collector")
    broker, dead_letters = make_broker(settings, "collector", telemetry)
    redis = connect_redis(settings.redis_url)
    tracer = telemetry.tracer("clusterwarden.collector")
    bulk = BulkPublisher(settings.kafka_bootstrap_servers, settings.namespace,
                         "warden-collector-bulk", tracer)
    keys = Keys(settings.namespace)
    nodes = NodeStore(redis, keys, settings.require_registration, settings.history_minutes,
                      settings.probe_period_s)
    probes = ProbeStore(redis, keys)
    prober = Prober(settings, probes, nodes,
                    local_signer(settings.signing_key, settings.state_dir),
                    EventBus(broker, settings.namespace))
    collector = Collector(
        settings,
        nodes,
        bulk,
        dead_letters,
        tracer,
        telemetry.meter("clusterwarden.collector"),
        probes,
        prober,
    )
    broker.subscriber(
        topic_name(Topic.NODE_REPORTS, settings.namespace),
        batch=True,
        max_records=settings.batch_max_records,
        decoder=raw_bodies,
        **consumer_options(group_name(settings, "collector")),
    )(collector.on_reports)
    broker.subscriber(
        topic_name(Topic.NODE_COMMAND_RESULTS, settings.namespace),
        decoder=strict_decoder(CommandResult, settings.max_message_bytes),
        **consumer_options(group_name(settings, "collector-probes")),
    )(prober.on_result)
    return build_app(
        broker,
        settings,
        loops=[("heartbeat-sweep", settings.sweep_interval_s, collector.sweep_heartbeats),
               ("probes", settings.sweep_interval_s, prober.tick)],
        starters=[bulk.start],
        closers=[bulk.stop, redis.aclose],
    )
