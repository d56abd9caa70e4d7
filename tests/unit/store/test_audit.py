"""The audit table: appended as a hash chain that any change, removal or cut-off breaks."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError
from sqlalchemy import delete, func, select, update

from services.store.audit import GENESIS
from services.store.db import Store
from services.store.models import AuditEntry
from services.store.queries import append_audit, audit_verdict, list_audit, verify_audit

AT = datetime(2026, 11, 30, 10, 0, 0, 123456, tzinfo=UTC)


async def append_three(store: Store) -> None:
    async with store.session() as s:
        await append_audit(s, "alice", "operator", "task.pause", "task/1", "node is hot",
                           "accepted", {"control_event": "c-1", "step": 2}, at=AT)
        await append_audit(s, "bob", "viewer", "auth.denied", "POST /api/tasks/1/jump",
                           "needs admin", "403", {})
        await append_audit(s, "carol", "admin", "breaker.reset", "c1/offline",
                           "fixed the rack\nfake line", "reset", {"ratio": 0.1, "n": None})


async def test_appended_entries_chain_and_list_newest_first(store: Store) -> None:
    await append_three(store)
    async with store.session() as s:
        rows, total = await list_audit(s, limit=10)
        assert await verify_audit(s)
        verdict = await audit_verdict(s)
    assert total == 3
    assert verdict.ok
    assert verdict.entries == 3
    assert [r.actor for r in rows] == ["carol", "bob", "alice"]
    oldest = rows[-1]
    assert oldest.prev_hash == GENESIS
    assert oldest.at == AT
    assert oldest.detail == {"control_event": "c-1", "step": 2}
    assert [r.prev_hash for r in rows[:-1]] == [r.hash for r in rows[1:]]
    assert rows[0].reason == "fixed the rack\nfake line"  # kept as given; hashed escaped
    async with store.session() as s:
        page, total = await list_audit(s, limit=1, offset=1)
    assert [r.actor for r in page] == ["bob"]
    assert total == 3


@pytest.mark.parametrize("tamper", ["reason", "detail", "time", "delete middle",
                                    "delete last", "swap"])
async def test_verify_finds_tampering(store: Store, tamper: str) -> None:
    await append_three(store)
    async with store.session() as s:
        ids = list((await s.execute(select(AuditEntry.id).order_by(AuditEntry.id))).scalars())
        change = update(AuditEntry).where(AuditEntry.id == ids[1])
        if tamper == "reason":
            await s.execute(change.values(reason="nothing to see"))
        elif tamper == "detail":
            await s.execute(update(AuditEntry).where(AuditEntry.id == ids[0])
                            .values(detail={"control_event": "c-2", "step": 2}))
        elif tamper == "time":
            await s.execute(change.values(at=datetime(2020, 1, 1, tzinfo=UTC)))
        elif tamper == "delete middle":
            await s.execute(delete(AuditEntry).where(AuditEntry.id == ids[1]))
        elif tamper == "delete last":
            await s.execute(delete(AuditEntry).where(AuditEntry.id == ids[2]))
        else:  # the first two entries' contents exchanged, hashes and all
            first = (await s.execute(select(AuditEntry).where(AuditEntry.id == ids[0])))
            a = first.scalar_one()
            b = (await s.execute(select(AuditEntry).where(AuditEntry.id == ids[1]))
                 ).scalar_one()
            values = [{c: getattr(x, c) for c in ("at", "actor", "role", "action", "target",
                                                  "reason", "result", "detail")}
                      for x in (a, b)]
            await s.execute(update(AuditEntry).where(AuditEntry.id == ids[0])
                            .values(**values[1]))
            await s.execute(update(AuditEntry).where(AuditEntry.id == ids[1])
                            .values(**values[0]))
    async with store.session() as s:
        verdict = await audit_verdict(s)
        assert not await verify_audit(s)
    assert not verdict.ok
    if tamper == "delete last":
        assert "cut off" in verdict.reason
    else:
        assert verdict.bad_id is not None


async def test_concurrent_appends_stay_one_chain(store: Store) -> None:
    async def one(i: int) -> None:
        async with store.session() as s:
            await append_audit(s, f"user{i}", "operator", "task.pause", f"task/{i}",
                               "busy", "accepted", {"i": i})

    await asyncio.gather(*(one(i) for i in range(12)))
    async with store.session() as s:
        verdict = await audit_verdict(s)
        count = (await s.execute(select(func.count()).select_from(AuditEntry))).scalar_one()
    assert verdict.ok
    assert verdict.entries == count == 12


async def test_an_append_rolled_back_leaves_no_trace(store: Store) -> None:
    async def append_then_fail() -> None:
        async with store.session() as s:
            await append_audit(s, "alice", "operator", "task.pause", "task/1", "r", "ok")
            raise RuntimeError("after the append")

    with pytest.raises(RuntimeError, match="after the append"):
        await append_then_fail()
    await append_three(store)
    async with store.session() as s:
        assert (await audit_verdict(s)).entries == 3


async def test_bad_entries_are_refused(store: Store) -> None:
    async with store.session() as s:
        with pytest.raises(ValidationError):
            await append_audit(s, "", "operator", "task.pause", "task/1", "r", "ok")
        with pytest.raises(ValidationError):
            await append_audit(s, "alice", "operator", "task.pause", "task/1", "r" * 501, "ok")
        with pytest.raises(ValueError, match="JSON"):
            await append_audit(s, "alice", "operator", "task.pause", "task/1", "r", "ok",
                               {"when": datetime.now(UTC)})
        with pytest.raises(ValueError, match=r"NaN|Out of range"):
            await append_audit(s, "alice", "operator", "task.pause", "task/1", "r", "ok",
                               {"ratio": float("nan")})
    async with store.session() as s:
        assert (await audit_verdict(s)).entries == 0
