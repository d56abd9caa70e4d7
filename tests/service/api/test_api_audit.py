"""The audit chain's head: keyed, so a tail cut off with the head rewritten to match fails its
MAC; exported and named again (`anchor`), which also finds a rollback to an older keyed head;
and keyed again by an admin once the log is checked."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, func, select, update

from services.shared.audit import FORGED, UNKEYED
from services.store.audit import GENESIS
from services.store.db import Store
from services.store.models import AuditEntry, AuditHead
from tests.service.api.conftest import Api


async def cut_the_tail(store: Store, entries: int) -> None:
    """What a forger with the store's credentials but not the audit key does: drop the last
    entries and rewrite the head to the one left last, so the chain is consistent again (the
    head's MAC is left as it was: making the right one needs the key)."""
    async with store.session() as session:
        last_ids = (await session.execute(
            select(AuditEntry.id).order_by(AuditEntry.id.desc()).limit(entries))).scalars().all()
        await session.execute(delete(AuditEntry).where(AuditEntry.id.in_(last_ids)))
        kept = (await session.execute(select(func.count()).select_from(AuditEntry))).scalar_one()
        last = (await session.execute(
            select(AuditEntry.hash).order_by(AuditEntry.id.desc()).limit(1))).scalar_one()
        await session.execute(update(AuditHead).values(hash=last, count=kept))
        await session.commit()


@dataclass(frozen=True)
class HeadCopy:
    hash: str
    count: int
    mac: str | None


async def copy_the_head(store: Store) -> HeadCopy:
    async with store.session() as session:
        row = (await session.execute(select(AuditHead.hash, AuditHead.count, AuditHead.mac))
               ).one()
    return HeadCopy(row[0], int(row[1]), row[2])


async def roll_back(store: Store, older: HeadCopy) -> None:
    """The log and its head as they were when `older` was copied (a backup restored): the
    entries after it removed, the head row put back, its MAC one the key did give."""
    async with store.session() as session:
        last_ids = (await session.execute(
            select(AuditEntry.id).order_by(AuditEntry.id).offset(older.count))).scalars().all()
        await session.execute(delete(AuditEntry).where(AuditEntry.id.in_(last_ids)))
        await session.execute(update(AuditHead).values(hash=older.hash, count=older.count,
                                                       mac=older.mac))


async def forbidden_calls(api: Api, count: int) -> None:
    for _ in range(count):
        assert (await api.get("/api/audit", role="operator")).status_code == 403


async def chain(api: Api, **params: str) -> dict[str, object]:
    verdict: dict[str, object] = (await api.get("/api/audit", role="admin", verify="true",
                                                **params)).json()["chain"]
    return verdict


async def test_the_head_is_the_last_entrys_hash_and_the_count(api: Api) -> None:
    assert (await api.get("/api/audit/head", role="admin")).json() == {"hash": GENESIS,
                                                                         "count": 0}
    await forbidden_calls(api, 3)
    head = (await api.get("/api/audit/head", role="admin")).json()
    [last] = (await api.audit())[-1:]
    assert head == {"hash": last.hash, "count": 3}
    assert (await api.get("/api/audit/head", role="operator")).status_code == 403


async def test_a_cut_off_tail_with_a_rewritten_head_fails_the_heads_mac(api: Api) -> None:
    await forbidden_calls(api, 5)
    anchor = (await api.get("/api/audit/head", role="admin")).json()["hash"]
    page = (await api.get("/api/audit", role="admin", anchor=anchor)).json()
    assert page["chain"] == {"ok": True, "entries": 5, "reason": "", "bad_id": None}
    await cut_the_tail(api.runtime.store, 2)
    # The chain alone is consistent again; the head's MAC is not the one for it.
    alone = await chain(api)
    assert (alone["ok"], alone["entries"]) == (False, 3)
    assert str(alone["reason"]).startswith(FORGED)
    # The anchor says more: which head was cut off.
    anchored = await chain(api, anchor=anchor)
    assert anchored["ok"] is False
    assert str(anchored["reason"]).startswith(f"the anchored head {anchor} is not in the chain")


async def test_an_append_to_a_rewritten_head_does_not_key_it_again(api: Api) -> None:
    await forbidden_calls(api, 4)
    await cut_the_tail(api.runtime.store, 2)
    await forbidden_calls(api, 2)  # two more entries, chained to the rewritten head
    after = await chain(api)
    assert (after["ok"], after["entries"]) == (False, 4)
    assert str(after["reason"]).startswith(UNKEYED)


async def test_a_rollback_to_an_older_keyed_head_is_found_only_against_the_anchor(
        api: Api) -> None:
    await forbidden_calls(api, 3)
    older = await copy_the_head(api.runtime.store)
    await forbidden_calls(api, 2)
    anchor = (await api.get("/api/audit/head", role="admin")).json()["hash"]
    await roll_back(api.runtime.store, older)
    # The key vouched for that head once: what it cannot tell is that it is not the last.
    assert await chain(api) == {"ok": True, "entries": 3, "reason": "", "bad_id": None}
    anchored = await chain(api, anchor=anchor)
    assert anchored["ok"] is False
    assert "is not in the chain" in str(anchored["reason"])


async def test_an_admin_keys_a_checked_head_and_the_keying_is_audited(api: Api) -> None:
    await forbidden_calls(api, 3)
    async with api.runtime.store.session() as session:  # a head from before the key
        await session.execute(update(AuditHead).values(mac=None))
    unkeyed = await chain(api)
    assert unkeyed["ok"] is False
    assert str(unkeyed["reason"]).startswith(UNKEYED)
    head = (await api.get("/api/audit/head", role="admin")).json()
    body = {"head": head["hash"], "reason": "checked against the head kept in the ticket"}
    assert (await api.post("/api/audit/head/key", body, role="operator")).status_code == 403
    other = await api.post("/api/audit/head/key", body | {"head": "a" * 64}, role="admin")
    assert other.status_code == 409
    assert "not " + "a" * 64 in other.json()["detail"]
    # The 403 and the 409 were appended to the unkeyed head: still unkeyed, still failing.
    assert (await chain(api))["ok"] is False
    head = (await api.get("/api/audit/head", role="admin")).json()
    keyed = await api.post("/api/audit/head/key", body | {"head": head["hash"]}, role="admin")
    assert keyed.status_code == 200, keyed.text
    assert keyed.json()["count"] == head["count"] + 1
    assert await chain(api) == {"ok": True, "entries": head["count"] + 1, "reason": "",
                                "bad_id": None}
    [entry] = (await api.audit())[-1:]
    assert (entry.actor, entry.action, entry.result) == (
        "ada", "audit_head_key", f"keyed at {head['count']} entries")
    assert entry.hash == keyed.json()["hash"]


async def test_a_broken_chain_is_not_keyed(api: Api) -> None:
    await forbidden_calls(api, 3)
    async with api.runtime.store.session() as session:
        first = (await session.execute(select(func.min(AuditEntry.id)))).scalar_one()
        await session.execute(update(AuditEntry).where(AuditEntry.id == first)
                              .values(reason="nothing to see"))
    head = (await api.get("/api/audit/head", role="admin")).json()
    refused = await api.post("/api/audit/head/key", {"head": head["hash"], "reason": "r"},
                             role="admin")
    assert refused.status_code == 409
    assert "was changed" in refused.json()["detail"]


async def test_an_anchor_must_be_a_chain_hash(api: Api) -> None:
    for bad in ("abc", "Z" * 64, "0" * 63):
        assert (await api.get("/api/audit", role="admin", anchor=bad)).status_code == 422
    refused = await api.post("/api/audit/head/key", {"head": "abc", "reason": "r"},
                             role="admin")
    assert refused.status_code == 422
