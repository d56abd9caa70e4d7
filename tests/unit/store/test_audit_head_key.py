"""The audit table's keyed head, on SQLite and PostgreSQL: a tail cut off with the head row
rewritten to match (by whoever can write the store but does not hold the audit key) fails the
head's MAC, so does another key, an append does not key such a head again, and two writers
still keep one keyed chain."""

from __future__ import annotations

import asyncio

from sqlalchemy import delete, func, select, update

from services.shared.audit import FORGED, UNKEYED, head_mac
from services.store.audit import CHAIN
from services.store.db import Store, open_store
from services.store.models import AuditEntry, AuditHead
from services.store.queries import append_audit, audit_head, audit_verdict, key_audit_head

KEY = b"a" * 32
OTHER_KEY = b"b" * 32


async def append(store: Store, count: int, key: bytes = KEY, actor: str = "alice") -> None:
    for n in range(count):
        async with store.session() as s:
            await append_audit(s, actor, "admin", "breaker.reset", f"c1/offline-{n}",
                               "repaired", "reset", {"n": n}, key=key)


async def cut_the_tail(store: Store, entries: int, mac: str | None = "keep") -> None:
    """Drop the last entries and point the head at the one left last; without the key the
    MAC can only be kept as it was, or changed to something else (None: removed)."""
    async with store.session() as s:
        last_ids = (await s.execute(
            select(AuditEntry.id).order_by(AuditEntry.id.desc()).limit(entries))).scalars().all()
        await s.execute(delete(AuditEntry).where(AuditEntry.id.in_(last_ids)))
        kept = (await s.execute(select(func.count()).select_from(AuditEntry))).scalar_one()
        last = (await s.execute(
            select(AuditEntry.hash).order_by(AuditEntry.id.desc()).limit(1))).scalar_one()
        change = update(AuditHead).values(hash=last, count=kept)
        await s.execute(change if mac == "keep" else change.values(mac=mac))


async def verdict_of(store: Store, key: bytes = KEY, anchor: str | None = None) -> tuple[
        bool, int, str]:
    async with store.session() as s:
        verdict = await audit_verdict(s, anchor, key=key)
    return verdict.ok, verdict.entries, verdict.reason


async def test_an_intact_chain_verifies_with_its_head_keyed(store: Store) -> None:
    await append(store, 4)
    assert await verdict_of(store) == (True, 4, "")
    async with store.session() as s:
        head = await audit_head(s)
        mac = (await s.execute(select(AuditHead.mac))).scalar_one()
    assert mac == head_mac(KEY, CHAIN, head.hash, 4)


async def test_a_cut_tail_with_a_rewritten_head_fails_the_mac(store: Store) -> None:
    await append(store, 5)
    await cut_the_tail(store, 2)
    assert await verdict_of(store) == (False, 3, FORGED)


async def test_a_cut_tail_with_the_mac_removed_is_not_keyed(store: Store) -> None:
    await append(store, 5)
    await cut_the_tail(store, 2, mac=None)
    assert await verdict_of(store) == (False, 3, UNKEYED)


async def test_a_cut_tail_with_a_made_up_mac_fails(store: Store) -> None:
    await append(store, 5)
    await cut_the_tail(store, 2, mac=head_mac(OTHER_KEY, CHAIN, "0" * 64, 3))
    assert await verdict_of(store) == (False, 3, FORGED)


async def test_another_key_fails(store: Store) -> None:
    await append(store, 3)
    assert await verdict_of(store, key=OTHER_KEY) == (False, 3, FORGED)


async def test_an_append_does_not_key_a_rewritten_head_again(store: Store) -> None:
    await append(store, 5)
    await cut_the_tail(store, 2)
    await append(store, 2, actor="bob")  # appended: the actions are not held up
    assert await verdict_of(store) == (False, 5, UNKEYED)


async def test_an_admin_keys_a_checked_head(store: Store) -> None:
    await append(store, 3)
    async with store.session() as s:
        await s.execute(update(AuditHead).values(mac=None))  # a head from before the key
    assert await verdict_of(store) == (False, 3, UNKEYED)
    async with store.session() as s:
        refused = await key_audit_head(s, "c" * 64, key=KEY)
        head = await audit_head(s)
    assert (refused.ok, refused.entries) == (False, 3)
    assert "the log moved on or was changed" in refused.reason
    async with store.session() as s:
        assert (await key_audit_head(s, head.hash, key=KEY)).ok
    assert await verdict_of(store) == (True, 3, "")
    await append(store, 2)  # keyed on from there
    assert await verdict_of(store) == (True, 5, "")


async def test_a_broken_chain_is_not_keyed(store: Store) -> None:
    await append(store, 3)
    async with store.session() as s:
        first = (await s.execute(select(func.min(AuditEntry.id)))).scalar_one()
        await s.execute(update(AuditEntry).where(AuditEntry.id == first).values(actor="eve"))
        head = await audit_head(s)
    async with store.session() as s:
        verdict = await key_audit_head(s, head.hash, key=KEY)
    assert (verdict.ok, verdict.bad_id) == (False, str(first))


async def test_a_rollback_to_an_older_keyed_head_is_found_by_the_anchor(store: Store) -> None:
    await append(store, 3)
    async with store.session() as s:
        older = (await s.execute(select(AuditHead.hash, AuditHead.count, AuditHead.mac))).one()
    await append(store, 2)
    async with store.session() as s:
        anchor = (await audit_head(s)).hash
        newer = (await s.execute(select(AuditEntry.id).order_by(AuditEntry.id).offset(3))
                 ).scalars().all()
        await s.execute(delete(AuditEntry).where(AuditEntry.id.in_(newer)))
        await s.execute(update(AuditHead).values(hash=older[0], count=older[1], mac=older[2]))
    assert await verdict_of(store) == (True, 3, "")  # the key vouched for that head once
    ok, entries, reason = await verdict_of(store, anchor=anchor)
    assert (ok, entries) == (False, 3)
    assert reason.startswith(f"the anchored head {anchor} is not in the chain")


async def test_two_writers_keep_one_keyed_chain(store: Store, database_url: str) -> None:
    other = open_store(database_url)  # a second process's engine and connections
    try:
        await asyncio.gather(append(store, 8, actor="alice"), append(other, 8, actor="bob"))
    finally:
        await other.close()
    assert await verdict_of(store) == (True, 16, "")
    async with store.session() as s:
        actors = (await s.execute(select(AuditEntry.actor))).scalars().all()
    assert sorted(set(actors)) == ["alice", "bob"]
