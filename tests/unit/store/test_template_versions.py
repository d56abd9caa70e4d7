"""The one save path of templates on a real store (SQLite, then PostgreSQL): seeding, a new
version per change with its audit entry and change event, no-op saves, a pinned template
refusing tuned saves, rollback, and newer built-in releases following unedited templates."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from schemas.events.v1 import TemplateChanged
from services.store.db import Store
from services.store.queries import list_audit, verify_audit
from services.store.template_seed import seed_templates
from services.store.template_versions import (
    SaveRequest,
    TemplateBook,
    TemplatePinned,
    history,
    load_active,
)
from services.templater.templates import TEMPLATE_DIR
from services.templater.validation import TemplateInvalid

LB = (TEMPLATE_DIR / "load_balance.yaml").read_text()


class Heard:
    def __init__(self) -> None:
        self.events: list[TemplateChanged] = []

    async def __call__(self, event: TemplateChanged) -> None:
        self.events.append(event)


@pytest.fixture
async def book(store: Store) -> TemplateBook:
    book = TemplateBook(store, Heard())
    await seed_templates(book, TEMPLATE_DIR)
    return book


def edit(text: str, reason: str = "two per run", origin: str = "manual") -> SaveRequest:
    return SaveRequest(name="load_balance", text=text, origin=origin,  # type: ignore[arg-type]
                       actor="ada", role="admin", reason=reason)


async def test_seeding_saves_every_built_in_template_once(book: TemplateBook) -> None:
    registry, versions = await load_active(book.store)
    assert versions == dict.fromkeys(("load_balance", "offline", "online", "restart_agent",
                                      "scale_in", "scale_out"), 1)
    assert registry["load_balance"].label == "load_balance.v1"
    assert await seed_templates(book, TEMPLATE_DIR) == []


async def test_a_change_is_the_next_version_audited_and_announced(book: TemplateBook) -> None:
    heard = book.notify
    assert isinstance(heard, Heard)
    heard.events.clear()
    saved = await book.save(edit(LB.replace("jobs_per_run: 1", "jobs_per_run: 2")))
    assert (saved.changed, saved.version.version, saved.previous_version) == (True, 2, 1)
    assert "version: 2" in saved.version.yaml
    [event] = heard.events
    assert (event.template, event.version, event.origin, event.actor) == (
        "load_balance", 2, "manual", "ada")
    _, versions = await load_active(book.store)
    assert versions["load_balance"] == 2
    async with book.store.session() as session:
        rows, _ = await list_audit(session)
        assert (rows[0].action, rows[0].result, rows[0].actor) == (
            "template_save", "saved load_balance.v2", "ada")
        assert await verify_audit(session)
    again = await book.save(edit(saved.version.yaml))
    assert again.changed is False
    assert len(heard.events) == 1


async def test_an_invalid_candidate_changes_nothing(book: TemplateBook) -> None:
    with pytest.raises(TemplateInvalid) as caught:
        await book.save(edit(LB.replace("jobs_per_run: 1", "jobs_per_run: 0")))
    assert "steps.0.args.max_jobs" in {p.field for p in caught.value.problems}
    with pytest.raises(TemplateInvalid):  # a second template for one need breaks the set
        await book.save(SaveRequest(name="lb2", text=LB.replace("name: load_balance",
                                                                "name: lb2"),
                                    origin="manual", actor="ada", role="admin", reason="x"))
    async with book.store.session() as session:
        assert [v.version for v in await history(session, "load_balance")] == [1]


async def test_a_pinned_template_refuses_tuned_saves_but_not_an_operators(
        book: TemplateBook) -> None:
    await book.pin("load_balance", True, "otto", "operator", "hands off during the audit")
    with pytest.raises(TemplatePinned):
        await book.save(edit(LB.replace("jobs_per_run: 1", "jobs_per_run: 2"),
                             origin="tuned"))
    saved = await book.save(edit(LB.replace("jobs_per_run: 1", "jobs_per_run: 2")))
    assert saved.version.version == 2
    state = await book.pin("load_balance", False, "otto", "operator", "done")
    assert (state.pinned, state.pinned_by) == (False, None)


async def test_a_rollback_is_a_new_version_with_the_old_text(book: TemplateBook) -> None:
    await book.save(edit(LB.replace("jobs_per_run: 1", "jobs_per_run: 2")))
    rolled = await book.rollback("load_balance", 1, "ada", "admin", "v2 moved too much")
    assert (rolled.version.version, rolled.version.origin) == (3, "rollback")
    assert rolled.version.yaml == LB.replace("version: 1", "version: 3")
    assert rolled.version.evidence == {"rolled_back_to": 1}


async def test_a_new_release_follows_unedited_templates_only(book: TemplateBook,
                                                            tmp_path: Path) -> None:
    await book.save(SaveRequest(
        name="offline", text=(TEMPLATE_DIR / "offline.yaml").read_text()
        .replace("priority: 1", "priority: 2"), origin="manual", actor="ada", role="admin",
        reason="edited"))
    release = tmp_path / "release"
    shutil.copytree(TEMPLATE_DIR, release)
    for name in ("offline", "load_balance"):
        path = release / f"{name}.yaml"
        path.write_text(path.read_text().replace("description: ", "description: New. ", 1))
    assert await seed_templates(book, release) == ["load_balance.v2"]
    _, versions = await load_active(book.store)
    assert (versions["load_balance"], versions["offline"]) == (2, 2)
