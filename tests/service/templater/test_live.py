"""The templater's live registry on a real store (SQLite, then PostgreSQL): it installs the
active versions, re-reads on a change event, ignores an event that names nothing new (a
forged or replayed one: the content is the store's), and keeps the registry that runs when
the store's active set does not load, dead-lettering the event with the reason."""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import uuid4

import pytest
from sqlalchemy import update

from common.errors import PermanentError
from schemas.events.v1 import NeedKind, TemplateChanged, now_utc
from services.store.db import Store, migrate, open_store
from services.store.models import TemplateVersion
from services.store.template_seed import seed_templates
from services.store.template_versions import SaveRequest, TemplateBook
from services.templater.live import LiveTemplates
from services.templater.templates import TEMPLATE_DIR, Template

LB = (TEMPLATE_DIR / "load_balance.yaml").read_text()


async def nobody(_: TemplateChanged) -> None:
    return None


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    await migrate(database_url)
    opened = open_store(database_url)
    try:
        await seed_templates(TemplateBook(opened, nobody), TEMPLATE_DIR)
        yield opened
    finally:
        await opened.close()


def changed(template: str, version: int) -> TemplateChanged:
    return TemplateChanged(event_id=uuid4(), source="store", occurred_at=now_utc(),
                           cluster_id="global", subject=template, template=template,
                           version=version, actor="ada")


class Installed:
    def __init__(self) -> None:
        self.registries: list[dict[NeedKind, Template]] = []

    def __call__(self, registry: dict[NeedKind, Template]) -> None:
        self.registries.append(registry)

    @property
    def label(self) -> str:
        return self.registries[-1]["load_balance"].label


async def test_a_change_event_installs_the_stores_new_version(store: Store) -> None:
    installed = Installed()
    live = LiveTemplates(store, installed)
    assert await live.reload("start")
    assert installed.label == "load_balance.v1"
    await TemplateBook(store, nobody).save(SaveRequest(
        name="load_balance", text=LB.replace("jobs_per_run: 1", "jobs_per_run: 2"),
        origin="manual", actor="ada", role="admin", reason="two"))
    await live.on_template_change(changed("load_balance", 2))
    assert installed.label == "load_balance.v2"
    assert len(installed.registries) == 2


async def test_an_event_naming_nothing_new_changes_nothing(store: Store) -> None:
    installed = Installed()
    live = LiveTemplates(store, installed)
    await live.reload("start")
    # Forged: a version the store does not hold. The store is read; nothing is installed.
    await live.on_template_change(changed("load_balance", 7))
    await live.on_template_change(changed("load_balance", 1))  # replayed: already running
    assert len(installed.registries) == 1
    assert live.versions["load_balance"] == 1


async def test_an_active_set_that_does_not_load_keeps_the_running_registry(
        store: Store) -> None:
    installed = Installed()
    live = LiveTemplates(store, installed)
    await live.reload("start")
    await TemplateBook(store, nobody).save(SaveRequest(
        name="load_balance", text=LB.replace("jobs_per_run: 1", "jobs_per_run: 2"),
        origin="manual", actor="ada", role="admin", reason="two"))
    # Damaged behind the save path's back (the save path itself never writes this).
    async with store.session() as session:
        await session.execute(update(TemplateVersion).where(
            TemplateVersion.name == "load_balance", TemplateVersion.version == 2)
            .values(yaml=LB.replace("version: 1", "version: 2")
                    .replace("jobs_per_run: 1", "jobs_per_run: 0")))
    with pytest.raises(PermanentError) as caught:
        await live.on_template_change(changed("load_balance", 2))
    assert caught.value.reason == "reload_failed"
    assert "steps.0.args.max_jobs" in str(caught.value)
    await live.tick()  # the periodic re-read fails the same way, logged, and keeps it too
    assert installed.label == "load_balance.v1"
    assert len(installed.registries) == 1
