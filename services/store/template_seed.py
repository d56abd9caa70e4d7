"""The built-in templates seeded into the task store, and newer releases of unedited ones.

The rule the template folder followed before the store held templates: a template the store
lacks is saved from the release (origin builtin); one whose every version is built in and
that is not pinned follows a newer release; one an operator or the tuner changed is left
alone. The set is checked once as a whole (built-in templates name each other in their
relations, so one at a time would not load).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy import exc as sa_exc
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from services.store.models import TemplateVersion
from services.store.template_versions import (
    SAVE_ATTEMPTS,
    SaveRequest,
    TemplateBook,
    active_rows,
    states,
)
from services.templater.validation import check_set, check_text, with_version

RELEASE_REASON = "built-in template of this release"


def builtin_texts(folder: Path) -> dict[str, str]:
    """The templates of `folder` by name (each checked alone; TemplateInvalid if one fails)."""
    texts: dict[str, str] = {}
    for path in sorted(folder.glob("*.yaml")):
        text = path.read_text()
        texts[check_text(text).name] = text
    return texts


async def seed_templates(book: TemplateBook, folder: Path,
                         actor: str = "templater") -> list[str]:
    """Seed `folder`'s templates (see the module docstring); the labels saved."""
    builtin = await asyncio.to_thread(builtin_texts, folder)
    for attempt in range(SAVE_ATTEMPTS):
        try:
            saved = await _seed_once(book, builtin, actor)
            break
        except (sa_exc.IntegrityError, sa_exc.OperationalError):
            # Another process seeded at the same moment (a version taken, or on SQLite a
            # snapshot another writer moved on): look again at what it left.
            if attempt == SAVE_ATTEMPTS - 1:
                raise
    for name, version in saved:
        await book.tell(name, version, "version", "builtin", actor, RELEASE_REASON)
    return [f"{name}.v{version}" for name, version in saved]


async def _origins(session: AsyncSession) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for name, origin in (await session.execute(
            select(TemplateVersion.name, TemplateVersion.origin).distinct())).all():
        found.setdefault(name, set()).add(origin)
    return found


async def _seed_once(book: TemplateBook, builtin: dict[str, str],
                     actor: str) -> list[tuple[str, int]]:
    async with book.store.session() as session:
        active = await active_rows(session)
        pinned = {s.name for s in await states(session) if s.pinned}
        origins = await _origins(session)
        todo: dict[str, tuple[int, int | None]] = {}
        for name, text in builtin.items():
            current = active.get(name)
            if current is None:
                todo[name] = (1, None)
            elif (origins.get(name) == {"builtin"} and name not in pinned
                  and with_version(text, current.version) != current.yaml):
                todo[name] = (current.version + 1, current.version)
        if not todo:
            return []
        texts = {name: with_version(builtin[name], v) for name, (v, _) in todo.items()}
        registry = await asyncio.to_thread(
            check_set, {**{n: r.yaml for n, r in active.items()}, **texts})
        by_name = {t.name: t for t in registry.values()}
        for name, (version, previous) in todo.items():
            request = SaveRequest(name=name, text=texts[name], origin="builtin", actor=actor,
                                  role="service", reason=RELEASE_REASON)
            await book.record(session, request, by_name[name], texts[name], version, previous)
    return [(name, version) for name, (version, _) in todo.items()]
