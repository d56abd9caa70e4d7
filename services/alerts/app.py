"""Alerts wiring: `faststream run services.alerts.app:create_app --factory`.

Consumes `ops.alerts.v1` in its own group ("alerts"), records each alert in the task store
(migrated first) and delivers it; one loop sends what is still undelivered and keeps firing
alerts alive in Alertmanager.
"""

from __future__ import annotations

from faststream import FastStream

from common.health import checks
from common.messaging import make_broker, subscribe
from common.telemetry import setup_telemetry
from schemas.topics import Topic
from services.alerts.delivery import Deliverer
from services.alerts.handlers import AlertsService
from services.alerts.settings import AlertsSettings
from services.shared.runtime import build_app
from services.store.db import migrate, open_store


def create_app(settings: AlertsSettings | None = None) -> FastStream:
    settings = settings or AlertsSettings()
    telemetry = setup_telemetry("alerts")
    broker, _ = make_broker(settings, "alerts", telemetry)
    store = open_store(settings.database_url)
    deliverer = Deliverer(settings.alertmanager_url, settings.webhook_urls,
                          settings.webhook_secret, settings.delivery_timeout_s)
    service = AlertsService(settings, store, deliverer)
    subscribe(broker, settings, Topic.OPS_ALERTS, "alerts", service.on_alert)

    async def migrate_schema() -> None:
        await migrate(settings.database_url)

    async def deliver() -> None:
        await service.deliver_due()

    return build_app(broker, settings,
                     loops=[("alerts-delivery", settings.delivery_interval_s, deliver)],
                     starters=[migrate_schema], closers=[deliverer.close, store.close],
                     dependencies=[checks.database(store.engine)])
