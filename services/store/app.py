"""Task store wiring: `faststream run services.store.app:create_app --factory`.

Consumes `ops.task-events.v1` in its own group ("store") and records every event, the
ML tasks' submissions, decisions and outcomes (groups "store-ml-*"), and the pools'
capacity plans (group "store-capacity-plans"); the schema is migrated before the broker
starts consuming.
"""

from __future__ import annotations

from faststream import FastStream

from common.health import checks
from common.messaging import make_broker, subscribe
from common.observability import sample_period_s
from common.telemetry import setup_telemetry
from schemas.topics import Topic
from services.shared.runtime import build_app
from services.store.db import migrate, open_store
from services.store.ml import MlRecorder
from services.store.plans import PlanRecorder
from services.store.recorder import Recorder
from services.store.settings import StoreSettings
from services.store.task_metrics import TaskMetrics


def create_app(settings: StoreSettings | None = None) -> FastStream:
    settings = settings or StoreSettings()
    telemetry = setup_telemetry("store")
    broker, _ = make_broker(settings, "store", telemetry)
    store = open_store(settings.database_url)
    task_metrics = TaskMetrics()
    recorder = Recorder(store, task_metrics)
    subscribe(broker, settings, Topic.OPS_TASK_EVENTS, "store", recorder.on_task_event)
    ml = MlRecorder(store)
    # One group per topic: a backlog of decisions never holds back the outcomes.
    subscribe(broker, settings, Topic.ML_TASKS_SUBMITTED, "store-ml-submitted", ml.on_submitted)
    subscribe(broker, settings, Topic.ML_DECISIONS, "store-ml-decisions", ml.on_selected)
    subscribe(broker, settings, Topic.ML_TASKS_OUTCOMES, "store-ml-outcomes", ml.on_outcome)
    plans = PlanRecorder(store)
    subscribe(broker, settings, Topic.OPS_CAPACITY_PLANS, "store-capacity-plans", plans.on_plan)

    async def migrate_schema() -> None:
        await migrate(settings.database_url)

    async def sample_open_tasks() -> None:
        await task_metrics.sample_open(store)

    return build_app(broker, settings, starters=[migrate_schema], closers=[store.close],
                     loops=[("open-tasks", sample_period_s(), sample_open_tasks)],
                     dependencies=[checks.database(store.engine)])
