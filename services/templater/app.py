"""Templater wiring: `faststream run services.templater.app:create_app --factory`."""

from __future__ import annotations

from pathlib import Path

from faststream import FastStream

from common.health import checks
from common.messaging import EventBus, make_broker, subscribe
from common.telemetry import setup_telemetry
from schemas.events.v1 import NeedKind, TemplateChanged
from schemas.topics import Topic
from services.shared.runtime import build_app
from services.store.db import migrate, open_store
from services.store.template_seed import seed_templates
from services.store.template_versions import TemplateBook
from services.templater.handlers import Templater
from services.templater.live import LiveTemplates
from services.templater.settings import TemplaterSettings
from services.templater.templates import TEMPLATE_DIR, Template


def create_app(settings: TemplaterSettings | None = None) -> FastStream:
    settings = settings or TemplaterSettings()
    telemetry = setup_telemetry("templater")
    broker, _ = make_broker(settings, "templater", telemetry)
    bus = EventBus(broker, settings.namespace)
    store = open_store(settings.database_url)
    templater = Templater({}, bus, settings.dry_run)

    def install(registry: dict[NeedKind, Template]) -> None:
        templater.templates = registry  # one assignment: a need sees the old or the new set

    live = LiveTemplates(store, install)

    async def notify(event: TemplateChanged) -> None:
        await bus.publish(Topic.OPS_TEMPLATE_CHANGES, event)

    async def load() -> None:
        # Before the broker consumes: a store whose templates do not load stops the templater
        # at start with the template and the field named, as a broken file did.
        await migrate(settings.database_url)
        folder = Path(settings.template_dir) if settings.template_dir else TEMPLATE_DIR
        await seed_templates(TemplateBook(store, notify), folder)
        await live.reload("start")

    subscribe(broker, settings, Topic.OPS_NEEDS, "templater", templater.on_need)
    # A group of its own per process: every templater instance must hear every change.
    subscribe(broker, settings, Topic.OPS_TEMPLATE_CHANGES,
              f"templater-changes-{settings.instance}",
              live.on_template_change)
    return build_app(broker, settings, starters=[load],
                     loops=[("template-reload", settings.reload_interval_s, live.tick)],
                     closers=[store.close], dependencies=[checks.database(store.engine)])

