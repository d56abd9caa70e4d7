"""Templater wiring: `faststream run services.templater.app:create_app --factory`."""

from __future__ import annotations

from pathlib import Path

from faststream import FastStream

from common.messaging import EventBus, make_broker, subscribe
from common.telemetry import setup_telemetry
from schemas.topics import Topic
from services.shared.runtime import build_app
from services.templater.handlers import Templater
from services.templater.settings import TemplaterSettings
from services.templater.templates import TEMPLATE_DIR, load_templates


def create_app(settings: TemplaterSettings | None = None) -> FastStream:
    settings = settings or TemplaterSettings()
    telemetry = setup_telemetry("templater")
    broker, _ = make_broker(settings, "templater", telemetry)
    # Loaded at start: a broken template stops the service with the file and field named.
    templates = load_templates(Path(settings.template_dir) if settings.template_dir
                               else TEMPLATE_DIR)
    templater = Templater(templates, EventBus(broker, settings.namespace), settings.dry_run)
    subscribe(broker, settings, Topic.OPS_NEEDS, "templater", templater.on_need)
    return build_app(broker, settings)
