"""What the API asks of the task store: tasks listed and filtered, one task in full, and the
audit log (append, list, verify, key its head). Each function works in the caller's session;
the caller commits (`async with store.session() as s:` does on leaving the block).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Final
from uuid import UUID

from pydantic import BaseModel, ConfigDict, StringConstraints
from sqlalchemy import ColumnElement, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.events.v1 import now_utc
from services.shared.audit import Verdict, audit_key, head_fault, head_mac
from services.store.audit import (
    CHAIN,
    GENESIS,
    Link,
    canonical_entry,
    chain_hash,
    check_link,
    json_detail,
)
from services.store.models import AuditEntry, AuditHead, StepRecord, Task, Transition
from services.store.views import AuditRow, StepRow, TaskDetail, TaskRow, TransitionRow

log = logging.getLogger("clusterwarden.store")

MAX_PAGE: Final = 500
HEAD_ID: Final = 1
VERIFY_BATCH: Final = 500


@dataclass(frozen=True)
class TaskFilter:
    """Which tasks to list; None matches everything.

    `node`: the task's target, or the node of any of its steps (a migration is found by its
    source and its destination). `kind`: the need kind or the task's kind (action type).
    `since`/`until`: tasks active in [since, until): created before `until` and last
    changed at or after `since`. Naive datetimes are taken as UTC.
    """

    node: str | None = None
    cluster: str | None = None
    state: str | None = None
    kind: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    parent: UUID | None = None
    top_level_only: bool = False


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _conditions(f: TaskFilter) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
    if f.node is not None:
        on_node = select(StepRecord.task_id).where(StepRecord.node_id == f.node)
        conditions.append(or_(Task.target == f.node, Task.task_id.in_(on_node)))
    if f.cluster is not None:
        conditions.append(Task.cluster_id == f.cluster)
    if f.state is not None:
        conditions.append(Task.state == f.state)
    if f.kind is not None:
        conditions.append(or_(Task.need_kind == f.kind, Task.kind == f.kind))
    if f.since is not None:
        conditions.append(Task.updated_at >= _utc(f.since))
    if f.until is not None:
        conditions.append(Task.created_at < _utc(f.until))
    if f.parent is not None:
        conditions.append(Task.parent_task_id == f.parent)
    if f.top_level_only:
        conditions.append(Task.parent_task_id.is_(None))
    return conditions


def _page(limit: int, offset: int) -> tuple[int, int]:
    return max(1, min(limit, MAX_PAGE)), max(0, offset)


async def list_tasks(session: AsyncSession, f: TaskFilter, limit: int = 50,
                     offset: int = 0) -> tuple[list[TaskRow], int]:
    """One page of the matching tasks, newest first, and how many match in all.

    `limit` is clamped to 1..MAX_PAGE and `offset` to >= 0.
    """
    limit, offset = _page(limit, offset)
    conditions = _conditions(f)
    total = (await session.execute(
        select(func.count()).select_from(Task).where(*conditions))).scalar_one()
    rows = (await session.execute(
        select(Task).where(*conditions)
        .order_by(Task.created_at.desc(), Task.task_id).limit(limit).offset(offset)
    )).scalars().all()
    return [TaskRow.model_validate(row) for row in rows], int(total)


async def get_task(session: AsyncSession, task_id: UUID) -> TaskDetail | None:
    """A task with its steps, transitions (oldest first), children, evidence and plan."""
    task = (await session.execute(select(Task).where(Task.task_id == task_id))).scalar_one_or_none()
    if task is None:
        return None
    steps = (await session.execute(
        select(StepRecord).where(StepRecord.task_id == task_id).order_by(StepRecord.index)
    )).scalars().all()
    transitions = (await session.execute(
        select(Transition).where(Transition.task_id == task_id)
        .order_by(Transition.occurred_at, Transition.id)
    )).scalars().all()
    children = (await session.execute(
        select(Task).where(Task.parent_task_id == task_id)
        .order_by(Task.created_at, Task.task_id)
    )).scalars().all()
    return TaskDetail.model_validate({
        **TaskRow.model_validate(task).model_dump(),
        "evidence": task.evidence,
        "plan": task.plan,
        "steps": [StepRow.model_validate(s) for s in steps],
        "transitions": [TransitionRow.model_validate(t) for t in transitions],
        "children": [TaskRow.model_validate(c) for c in children],
    })


# ------------------------------------------------------------------ audit

Short = Annotated[str, StringConstraints(min_length=1, max_length=128)]


class _AuditInput(BaseModel):
    """The bounds of an audit entry's fields (the columns' sizes)."""

    model_config = ConfigDict(strict=True, frozen=True)

    actor: Short
    role: Annotated[str, StringConstraints(min_length=1, max_length=32)]
    action: Short
    target: Annotated[str, StringConstraints(max_length=256)]
    reason: Annotated[str, StringConstraints(max_length=500)]
    result: Annotated[str, StringConstraints(max_length=256)]


async def append_audit(session: AsyncSession, actor: str, role: str, action: str,
                       target: str, reason: str, result: str,
                       detail: Mapping[str, Any] | None = None, *,
                       at: datetime | None = None, key: bytes | None = None) -> AuditRow:
    """Append one entry to the hash chain (ValidationError/ValueError on bad fields).

    Appends from several processes stay one chain: the head row is locked first (an UPDATE,
    which takes PostgreSQL's row lock and SQLite's write lock alike) and held until the
    caller's transaction ends, so the next append reads the head this one leaves.

    The new head is keyed (`key`: the audit key; None: this process's) in the same
    transaction, unless the head it chains to fails its MAC: the entry is still written (the
    action it records should not wait on whoever broke the log), but keying its head would
    make a cut log verify, so the head is left unkeyed until an admin keys it
    (`key_audit_head`).
    """
    fields = _AuditInput(actor=actor, role=role, action=action, target=target, reason=reason,
                         result=result)
    plain = json_detail(detail)
    at = _utc(at) if at is not None else now_utc()
    key = audit_key() if key is None else key
    await _lock_head(session)
    head_hash, head_count, read_mac = (await session.execute(
        select(AuditHead.hash, AuditHead.count, AuditHead.mac).where(AuditHead.id == HEAD_ID)
    )).one()
    fault = head_fault(key, CHAIN, head_hash, head_count, read_mac)
    body = canonical_entry(at=at, actor=fields.actor, role=fields.role, action=fields.action,
                           target=fields.target, reason=fields.reason, result=fields.result,
                           detail=plain, prev_hash=head_hash)
    entry = AuditEntry(at=at, actor=fields.actor, role=fields.role, action=fields.action,
                       target=fields.target, reason=fields.reason, result=fields.result,
                       detail=plain, prev_hash=head_hash, hash=chain_hash(head_hash, body))
    session.add(entry)
    await session.flush()
    await session.execute(
        update(AuditHead).where(AuditHead.id == HEAD_ID)
        .values(hash=entry.hash, count=head_count + 1,
                mac=None if fault else head_mac(key, CHAIN, entry.hash, head_count + 1))
        .execution_options(synchronize_session=False))
    if fault:
        log.error("audit entry %d appended to a head that fails its MAC (%s); the head is left "
                  "unkeyed until an admin checks the log and keys it", entry.id, fault)
    return AuditRow.model_validate(entry)


async def _lock_head(session: AsyncSession) -> None:
    """Lock the head row until the transaction ends (a no-op UPDATE takes the lock)."""
    await session.execute(
        update(AuditHead).where(AuditHead.id == HEAD_ID).values(count=AuditHead.count)
        .execution_options(synchronize_session=False))


async def list_audit(session: AsyncSession, limit: int = 50,
                     offset: int = 0) -> tuple[list[AuditRow], int]:
    """One page of the audit log, newest first, and how many entries it holds."""
    limit, offset = _page(limit, offset)
    total = (await session.execute(select(func.count()).select_from(AuditEntry))).scalar_one()
    rows = (await session.execute(
        select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit).offset(offset)
    )).scalars().all()
    return [AuditRow.model_validate(row) for row in rows], int(total)


@dataclass(frozen=True)
class AuditHeadValue:
    """The chain's head: its last hash and how many entries it holds (GENESIS, 0 if none)."""

    hash: str
    count: int


async def audit_head(session: AsyncSession) -> AuditHeadValue:
    head = (await session.execute(
        select(AuditHead.hash, AuditHead.count).where(AuditHead.id == HEAD_ID))).one_or_none()
    return AuditHeadValue(GENESIS, 0) if head is None else AuditHeadValue(head[0], int(head[1]))


async def audit_verdict(session: AsyncSession, anchor: str | None = None,
                        key: bytes | None = None) -> Verdict:
    """Recompute the chain from the first entry, compare its end with the head, and check
    the head's MAC against the recomputed last hash and count (`key`: the audit key; None:
    this process's).

    `anchor`: a head exported earlier (`/api/v1/audit/head`) and kept apart from the store. The
    chain must still hold an entry of that hash. The MAC already finds a tail cut off with the
    head rewritten to match; the anchor also finds a rollback to an older head the key did
    vouch for (the log and its head restored from an earlier copy).
    """
    verdict, head = await _chain_verdict(session, anchor)
    if not verdict.ok or head is None:
        return verdict
    fault = head_fault(audit_key() if key is None else key, CHAIN, head.hash, head.count,
                       head.mac)
    return Verdict(False, verdict.entries, fault) if fault else verdict


async def key_audit_head(session: AsyncSession, expected_hash: str,
                         key: bytes | None = None) -> Verdict:
    """Key the head after an admin has checked the log: a head from before the key was set,
    or one an append left unkeyed because the head before it failed its MAC.

    Done only if the chain recomputes to the head and the head's hash is `expected_hash` (the
    one the admin checked, e.g. against an exported anchor): a tail cut off before is keyed
    too, so this is an admin's decision (audited by the caller), never an append's. The head
    is locked first, so no append moves it between the check and the keying.
    """
    await _lock_head(session)
    verdict, head = await _chain_verdict(session, None)
    if not verdict.ok or head is None:
        return verdict
    if head.hash != expected_hash:
        return Verdict(False, verdict.entries, f"the head is {head.hash}, not {expected_hash}: "
                                               "the log moved on or was changed")
    await session.execute(
        update(AuditHead).where(AuditHead.id == HEAD_ID)
        .values(mac=head_mac(audit_key() if key is None else key, CHAIN, head.hash, head.count))
        .execution_options(synchronize_session=False))
    return verdict


@dataclass(frozen=True)
class _HeadRow:
    hash: str
    count: int
    mac: str | None


async def _chain_verdict(session: AsyncSession,
                         anchor: str | None) -> tuple[Verdict, _HeadRow | None]:
    """The chain recomputed and compared with the head row (not its MAC), and that row."""
    running, count, last_id = GENESIS, 0, None
    anchored = anchor is None or anchor == GENESIS
    while True:
        query = select(AuditEntry).order_by(AuditEntry.id).limit(VERIFY_BATCH)
        if last_id is not None:
            query = query.where(AuditEntry.id > last_id)
        batch = (await session.execute(query)).scalars().all()
        for row in batch:
            why = check_link(running, Link(
                id=row.id, at=row.at, actor=row.actor, role=row.role, action=row.action,
                target=row.target, reason=row.reason, result=row.result, detail=row.detail,
                prev_hash=row.prev_hash, hash=row.hash))
            if why:
                return Verdict(False, count, why, str(row.id)), None
            running, count, last_id = row.hash, count + 1, row.id
            anchored = anchored or row.hash == anchor
        if len(batch) < VERIFY_BATCH:
            break
    found = (await session.execute(
        select(AuditHead.hash, AuditHead.count, AuditHead.mac).where(AuditHead.id == HEAD_ID)
    )).one_or_none()
    head = None if found is None else _HeadRow(found[0], int(found[1]), found[2])
    if head is None or head.hash != running or head.count != count:
        said = "no head" if head is None else f"head says {head.count} entries"
        return Verdict(False, count, f"{said}, the table holds {count}: entries cut off or "
                                     "head changed"), head
    if not anchored:
        return Verdict(False, count, f"the anchored head {anchor} is not in the chain: entries "
                                     "cut off and the head rewritten to match"), head
    return Verdict(True, count), head


async def verify_audit(session: AsyncSession) -> bool:
    """True if the audit log is intact (see `audit_verdict` for where it breaks)."""
    return (await audit_verdict(session)).ok
