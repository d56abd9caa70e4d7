"""Tuner wiring: `faststream run services.tuner.app:create_app --factory`.

Its own service rather than a loop in the analyzer: it reads the samples in a consumer group
of its own, so tuning never slows fault detection on the 5,000 reports/s path, and only it
(beside the API and the templater) needs the task store, where it saves tuned versions.
"""

from __future__ import annotations

import time

from faststream import FastStream

from common.health import checks
from common.messaging import EventBus, make_broker, subscribe
from common.telemetry import setup_telemetry
from schemas.events.v1 import TemplateChanged
from schemas.topics import Topic
from services.shared.redis_client import Keys, connect_redis
from services.shared.runtime import build_app
from services.store.db import migrate, open_store
from services.store.template_versions import TemplateBook
from services.tuner.handlers import Tuner
from services.tuner.measures import Measures
from services.tuner.settings import TunerSettings


def create_app(settings: TunerSettings | None = None) -> FastStream:
    settings = settings or TunerSettings()
    telemetry = setup_telemetry("tuner")
    broker, _ = make_broker(settings, "tuner", telemetry)
    bus = EventBus(broker, settings.namespace)
    redis = connect_redis(settings.redis_url, settings.redis_connect_timeout_s,
                          settings.redis_read_timeout_s)
    store = open_store(settings.database_url)

    async def notify(event: TemplateChanged) -> None:
        await bus.publish(Topic.OPS_TEMPLATE_CHANGES, event)

    measures = Measures(redis, Keys(settings.namespace), settings.alpha, time.time)
    tuner = Tuner(measures, TemplateBook(store, notify))
    subscribe(broker, settings, Topic.OPS_SAMPLES, "tuner", tuner.on_samples)

    async def migrate_schema() -> None:
        await migrate(settings.database_url)

    async def close() -> None:
        await store.close()
        await redis.aclose()

    return build_app(broker, settings, starters=[migrate_schema],
                     loops=[("tuning", settings.period_s, tuner.tick)], closers=[close],
                     dependencies=[checks.redis(redis), checks.database(store.engine)])
