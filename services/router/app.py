"""Router wiring: `faststream run services.router.app:create_app --factory`.

Three consumer groups: submissions (`router`), the agents' answers (`router-results`) and
the agents' reports, consumed in batches, which feed the model registry (`router-registry`);
one loop, the sweep, looks at tasks that are due (an attempt's deadline, a task waiting for
a slot).
"""

from __future__ import annotations

from faststream import FastStream

from schemas.events.v1 import CommandResult, MlTaskSubmitted
from schemas.topics import Topic, topic_name
from services.router.handlers import ReportFeed, Router
from services.router.registry import Registry
from services.router.settings import RouterSettings
from services.router.stats_store import StatsStore
from services.shared.messaging import (
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


def create_app(settings: RouterSettings | None = None) -> FastStream:
    settings = settings or RouterSettings()
    telemetry = setup_telemetry("router")
    broker, dead_letters = make_broker(settings, "router", telemetry)
    redis = connect_redis(settings.redis_url)
    keys = Keys(settings.namespace)
    router = Router(
        settings, redis, keys, EventBus(broker, settings.namespace),
        local_signer(settings.signing_key, settings.state_dir),
        Registry(redis, keys, cache_s=settings.registry_cache_s,
                 forget_after_s=settings.registry_forget_after_s,
                 require_registration=settings.require_registration),
        StatsStore(keys, settings.stats_ttl_s),
    )
    limit = settings.max_message_bytes
    feed = ReportFeed(router.registry, dead_letters, limit)
    broker.subscriber(
        topic_name(Topic.ML_TASKS_SUBMITTED, settings.namespace),
        decoder=strict_decoder(MlTaskSubmitted, limit),
        **consumer_options(group_name(settings, "router")),
    )(router.on_submitted)
    broker.subscriber(
        topic_name(Topic.NODE_COMMAND_RESULTS, settings.namespace),
        decoder=strict_decoder(CommandResult, limit),
        **consumer_options(group_name(settings, "router-results")),
    )(router.on_result)
    broker.subscriber(
        topic_name(Topic.NODE_REPORTS, settings.namespace),
        batch=True,
        max_records=settings.batch_max_records,
        decoder=raw_bodies,
        **consumer_options(group_name(settings, "router-registry")),
    )(feed.on_reports)
    return build_app(
        broker, settings,
        loops=[("ml-sweep", settings.sweep_interval_s, router.sweep)],
        closers=[redis.aclose],
    )
