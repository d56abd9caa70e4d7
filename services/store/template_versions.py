"""Template versions in the task store, and the one save path every change goes through.

An operator's edit, a rollback, the tuner and the seeding of built-in templates all save
through `TemplateBook`: the candidate is checked with the templater's rules, alone and in the
set it joins (services/templater/validation.py); it gets the next version number (written
into its text, so tasks name it `name.vN`); its row, the template's new active version and an
audit entry commit in one transaction; then a `TemplateChanged` event tells the templaters to
reload from the store. Versions are never changed or deleted: a rollback is a new version
equal to an old one.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import uuid4

from pydantic import BaseModel, ConfigDict
from sqlalchemy import exc as sa_exc
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from common.clock import Clock
from schemas.envelope import reason_text, short_text
from schemas.events.v1 import NeedKind, TemplateChanged, TemplateOrigin, now_utc
from services.store.db import Store
from services.store.models import TemplateState, TemplateVersion
from services.store.queries import append_audit
from services.templater.templates import Template
from services.templater.validation import (
    check_set,
    check_text,
    invalid,
    with_version,
)

log = logging.getLogger("clusterwarden.store.templates")
Notify = Callable[[TemplateChanged], Awaitable[None]]
SAVE_ATTEMPTS = 3
_ROW = ConfigDict(from_attributes=True, frozen=True)
# The audit action of a new version, by where it came from.
AUDIT_ACTIONS: dict[str, str] = {"manual": "template_save", "rollback": "template_rollback",
                                 "tuned": "template_tuned"}


class VersionRow(BaseModel):
    """One stored version of a template."""

    model_config = _ROW

    name: str
    version: int
    need: str
    yaml: str
    sha256: str
    origin: str
    actor: str
    reason: str
    evidence: dict[str, Any]
    created_at: datetime


class StateRow(BaseModel):
    """A template's active version and pin."""

    model_config = _ROW

    name: str
    active_version: int
    pinned: bool
    pinned_by: str | None
    pin_reason: str | None
    pinned_at: datetime | None
    updated_at: datetime


class TemplatePinned(ValueError):
    """A tuned save of a pinned template (pinned templates are never tuned)."""


class UnknownVersion(LookupError):
    """No such template, or no such version of it."""


@dataclass(frozen=True)
class SaveRequest:
    """A candidate version: its text, and who makes it, why, from what."""

    name: str
    text: str
    origin: TemplateOrigin
    actor: str
    role: str
    reason: str
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Saved:
    """What a save did: the active version after it, and whether it made a new one."""

    version: VersionRow
    template: Template
    previous_version: int | None
    changed: bool


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# ------------------------------------------------------------------ reading


async def state_of(session: AsyncSession, name: str) -> StateRow | None:
    row = await session.get(TemplateState, name)
    return StateRow.model_validate(row) if row is not None else None


async def states(session: AsyncSession) -> list[StateRow]:
    rows = (await session.scalars(select(TemplateState).order_by(TemplateState.name))).all()
    return [StateRow.model_validate(r) for r in rows]


async def version_of(session: AsyncSession, name: str, version: int) -> VersionRow | None:
    row = (await session.scalars(select(TemplateVersion).where(
        TemplateVersion.name == name, TemplateVersion.version == version))).first()
    return VersionRow.model_validate(row) if row is not None else None


async def history(session: AsyncSession, name: str) -> list[VersionRow]:
    """Every version of `name`, newest first."""
    rows = (await session.scalars(select(TemplateVersion).where(TemplateVersion.name == name)
                                  .order_by(TemplateVersion.version.desc()))).all()
    return [VersionRow.model_validate(r) for r in rows]


async def active_rows(session: AsyncSession) -> dict[str, VersionRow]:
    """The active version of every template, by name."""
    rows = (await session.execute(
        select(TemplateVersion).join(TemplateState, (TemplateState.name == TemplateVersion.name)
                                     & (TemplateState.active_version == TemplateVersion.version))
        .order_by(TemplateVersion.name))).scalars().all()
    return {r.name: VersionRow.model_validate(r) for r in rows}


async def load_active(store: Store) -> tuple[dict[NeedKind, Template], dict[str, int]]:
    """The registry the templater runs (the active versions, checked as a set), and the
    active version of each template; TemplateInvalid if they do not load."""
    async with store.session() as session:
        active = await active_rows(session)
    if not active:
        raise invalid("template", "the task store holds no templates yet")
    registry = await asyncio.to_thread(check_set, {n: r.yaml for n, r in active.items()})
    return registry, {n: r.version for n, r in active.items()}


# ------------------------------------------------------------------ the save path


class TemplateBook:
    """Saves, rolls back, pins and seeds templates; the only writer of the template tables."""

    def __init__(self, store: Store, notify: Notify, clock: Clock = now_utc) -> None:
        self.store = store
        self.notify = notify
        self.clock = clock

    async def save(self, request: SaveRequest) -> Saved:
        """Check and save a candidate as the next version (TemplateInvalid, TemplatePinned).

        Saving what the active version already says (whatever its version line) changes
        nothing. Two saves at once cannot both take a version: the loser checks again.
        """
        for attempt in range(SAVE_ATTEMPTS):
            try:
                saved = await self._save_once(request)
            except (sa_exc.IntegrityError, sa_exc.OperationalError):
                if attempt == SAVE_ATTEMPTS - 1:
                    raise
                continue
            if saved.changed:
                await self.tell(request.name, saved.version.version, "version",
                                 request.origin, request.actor, request.reason)
            return saved
        raise AssertionError("unreachable")  # pragma: no cover

    async def _save_once(self, request: SaveRequest) -> Saved:
        async with self.store.session() as session:
            state = await state_of(session, request.name)
            if (state is not None and state.pinned and request.origin == "tuned"):
                raise TemplatePinned(f"template {request.name} is pinned by {state.pinned_by}: "
                                     f"{state.pin_reason}")
            active = await active_rows(session)
            current = active.get(request.name)
            if current is not None and with_version(request.text, current.version) == current.yaml:
                template = await asyncio.to_thread(check_text, current.yaml, request.name)
                return Saved(current, template, current.version, changed=False)
            latest = await session.scalar(select(func.max(TemplateVersion.version))
                                          .where(TemplateVersion.name == request.name))
            version = (latest or 0) + 1
            text = with_version(request.text, version)
            template = await asyncio.to_thread(check_text, text, request.name)
            others = {n: r.yaml for n, r in active.items() if n != request.name}
            await asyncio.to_thread(check_set, {**others, request.name: text})
            previous = current.version if current else None
            row = await self.record(session, request, template, text, version, previous)
        return Saved(row, template, current.version if current else None, changed=True)

    async def record(self, session: AsyncSession, request: SaveRequest, template: Template,
                     text: str, version: int, previous: int | None) -> VersionRow:
        """Write a checked version, make it active and audit it (in the caller's session)."""
        now = self.clock()
        row = TemplateVersion(
            name=request.name, version=version, need=template.need, yaml=text,
            sha256=sha256(text), origin=request.origin, actor=short_text(request.actor)[:128],
            reason=reason_text(request.reason), evidence=dict(request.evidence),
            created_at=now)
        session.add(row)
        state = await session.get(TemplateState, request.name)
        if state is None:
            session.add(TemplateState(name=request.name, active_version=version, pinned=False,
                                      updated_at=now))
        else:
            state.active_version = version
            state.updated_at = now
        await session.flush()
        saved = VersionRow.model_validate(row)
        if request.origin == "builtin":
            # A release's own templates: the version row says where it came from; the audit
            # log is for what someone (an operator, the tuner) chose to change.
            return saved
        await append_audit(
            session, actor=saved.actor, role=request.role,
            action=AUDIT_ACTIONS[request.origin], target=f"template/{request.name}",
            reason=saved.reason, result=f"saved {template.label}",
            detail={"version": version, "origin": request.origin, "sha256": saved.sha256,
                    "previous_version": previous, "evidence": dict(request.evidence)})
        return saved

    async def rollback(self, name: str, version: int, actor: str, role: str,
                       reason: str) -> Saved:
        """A new version whose text is version `version`'s (UnknownVersion, TemplateInvalid)."""
        async with self.store.session() as session:
            old = await version_of(session, name, version)
        if old is None:
            raise UnknownVersion(f"template {name} has no version {version}")
        return await self.save(SaveRequest(
            name=name, text=old.yaml, origin="rollback", actor=actor, role=role,
            reason=reason, evidence={"rolled_back_to": version}))

    async def pin(self, name: str, pinned: bool, actor: str, role: str,
                  reason: str) -> StateRow:
        """Pin (no tuning) or unpin a template, audited (UnknownVersion if there is none)."""
        async with self.store.session() as session:
            state = await session.get(TemplateState, name)
            if state is None:
                raise UnknownVersion(f"no template {name}")
            state.pinned = pinned
            state.pinned_by = short_text(actor)[:128] if pinned else None
            state.pin_reason = reason_text(reason) if pinned else None
            state.pinned_at = self.clock() if pinned else None
            state.updated_at = self.clock()
            await session.flush()
            row = StateRow.model_validate(state)
            await append_audit(session, actor=short_text(actor)[:128], role=role,
                               action="template_pin" if pinned else "template_unpin",
                               target=f"template/{name}", reason=reason_text(reason),
                               result="pinned" if pinned else "unpinned",
                               detail={"active_version": row.active_version})
        await self.tell(name, row.active_version, "pin" if pinned else "unpin", None, actor,
                         reason)
        return row

    async def tell(self, name: str, version: int, change: str, origin: TemplateOrigin | None,
                    actor: str, reason: str) -> None:
        # After the commit: a templater that misses the event still finds the change on its
        # periodic re-read.
        event = TemplateChanged(
            event_id=uuid4(), source="store", occurred_at=self.clock(), cluster_id="global",
            subject=name, template=name, version=version,
            change=change,  # type: ignore[arg-type]
            origin=origin, actor=_identifier(actor), reason=short_text(reason))
        try:
            await self.notify(event)
        except Exception as err:  # the change is saved; readers re-read periodically
            log.warning("template %s v%d saved, but the change event failed: %r", name,
                        version, err)


def _identifier(actor: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "_.-" else "_" for c in actor)[:128]
    return cleaned or "unknown"
