"""Task store wiring: `faststream run services.store.app:create_app --factory`.

Consumes `ops.task-events.v1` in its own group ("store") and records every event, and the
ML tasks' submissions, decisions and outcomes (groups "store-ml-*"); the schema is
migrated before the broker starts consuming.
"""

from __future__ import annotations

from faststream import FastStream

from schemas.events.v1 import MlTaskOutcome, MlTaskSubmitted, ModelSelected, TaskEvent
from schemas.topics import Topic, topic_name
from services.shared.messaging import consumer_options, group_name, make_broker, strict_decoder
from services.shared.runtime import build_app
from services.shared.telemetry import setup_telemetry
from services.store.db import migrate, open_store
from services.store.ml import MlRecorder
from services.store.recorder import Recorder
from services.store.settings import StoreSettings


def create_app(settings: StoreSettings | None = None) -> FastStream:
    settings = settings or StoreSettings()
    telemetry = setup_telemetry("store")
    broker, _ = make_broker(settings, "store", telemetry)
    store = open_store(settings.database_url)
    recorder = Recorder(store)
    broker.subscriber(
        topic_name(Topic.OPS_TASK_EVENTS, settings.namespace),
        decoder=strict_decoder(TaskEvent, settings.max_message_bytes),
        **consumer_options(group_name(settings, "store")),
    )(recorder.on_task_event)
    ml = MlRecorder(store)
    # One group per topic: a backlog of decisions never holds back the outcomes.
    broker.subscriber(
        topic_name(Topic.ML_TASKS_SUBMITTED, settings.namespace),
        decoder=strict_decoder(MlTaskSubmitted, settings.max_message_bytes),
        **consumer_options(group_name(settings, "store-ml-submitted")),
    )(ml.on_submitted)
    broker.subscriber(
        topic_name(Topic.ML_DECISIONS, settings.namespace),
        decoder=strict_decoder(ModelSelected, settings.max_message_bytes),
        **consumer_options(group_name(settings, "store-ml-decisions")),
    )(ml.on_selected)
    broker.subscriber(
        topic_name(Topic.ML_TASKS_OUTCOMES, settings.namespace),
        decoder=strict_decoder(MlTaskOutcome, settings.max_message_bytes),
        **consumer_options(group_name(settings, "store-ml-outcomes")),
    )(ml.on_outcome)

    async def migrate_schema() -> None:
        await migrate(settings.database_url)

    return build_app(broker, settings, starters=[migrate_schema], closers=[store.close])
