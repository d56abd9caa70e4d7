"""Collector wiring: `faststream run services.collector.app:create_app --factory`."""

from __future__ import annotations

from faststream import FastStream

from common.health import checks
from common.kafka_access import client_options
from common.messaging import BulkPublisher, EventBus, make_broker, subscribe
from common.reportauth import authenticator_for, result_seal
from common.signing import local_signer
from common.telemetry import setup_telemetry
from schemas.topics import Topic
from services.collector.handlers import Collector, Prober
from services.collector.peers import PeerStore, PeerWatch
from services.collector.settings import CollectorSettings
from services.collector.store import NodeStore, ProbeStore
from services.shared.outbox import outbox_period_s
from services.shared.redis_client import Keys, connect_redis
from services.shared.runtime import build_app


def create_app(settings: CollectorSettings | None = None) -> FastStream:
    settings = settings or CollectorSettings()
    telemetry = setup_telemetry("collector")
    broker, dead_letters = make_broker(settings, "collector", telemetry)
    redis = connect_redis(settings.redis_url, settings.redis_connect_timeout_s,
                          settings.redis_read_timeout_s)
    tracer = telemetry.tracer("clusterwarden.collector")
    bulk = BulkPublisher(client_options(settings), settings.namespace,
                         "warden-collector-bulk", tracer)
    keys = Keys(settings.namespace)
    nodes = NodeStore(redis, keys, settings.require_registration, settings.history_minutes,
                      settings.probe_period_s)
    probes = ProbeStore(redis, keys)
    signer = local_signer(settings.signing_key, settings.state_dir, "collector")
    bus = EventBus(broker, settings.namespace)
    prober = Prober(settings, probes, nodes, signer, bus)
    peers = PeerWatch(settings, PeerStore(redis, keys, settings.peer_verdict_max_age_s * 2),
                      signer, bus)
    authenticator = authenticator_for(settings)
    collector = Collector(
        settings,
        nodes,
        bulk,
        dead_letters,
        tracer,
        telemetry.meter("clusterwarden.collector"),
        probes,
        prober,
        peers=peers,
        authenticator=authenticator,
    )
    subscribe(broker, settings, Topic.NODE_REPORTS, "collector", collector.on_reports,
              batch_records=settings.batch_max_records)
    subscribe(broker, settings, Topic.NODE_COMMAND_RESULTS, "collector-probes", prober.on_result,
              seal=result_seal(settings, authenticator))
    return build_app(
        broker,
        settings,
        loops=[("heartbeat-sweep", settings.sweep_interval_s, collector.sweep_heartbeats),
               ("probes", settings.sweep_interval_s, prober.tick),
               ("peers", settings.peer_assign_period_s, collector.assign_peers),
               ("outbox-relay", outbox_period_s(settings), collector.relay_outbox)],
        starters=[bulk.start],
        closers=[bulk.stop, redis.aclose],
        dependencies=[checks.redis(redis)],
    )
