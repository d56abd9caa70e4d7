"""The audit chain's head, exported and named again: a tail cut off with the head rewritten
to match passes the chain's own check, and is found against the anchored head."""

from __future__ import annotations

from sqlalchemy import delete, func, select, update

from services.store.audit import GENESIS
from services.store.db import Store
from services.store.models import AuditEntry, AuditHead
from tests.service.api.conftest import Api


async def cut_the_tail(store: Store, entries: int) -> None:
    """What a forger with the store's credentials does: drop the last entries and rewrite the
    head to the one left last, so the chain is consistent again."""
    async with store.session() as session:
        last_ids = (await session.execute(
            select(AuditEntry.id).order_by(AuditEntry.id.desc()).limit(entries))).scalars().all()
        await session.execute(delete(AuditEntry).where(AuditEntry.id.in_(last_ids)))
        kept = (await session.execute(select(func.count()).select_from(AuditEntry))).scalar_one()
        last = (await session.execute(
            select(AuditEntry.hash).order_by(AuditEntry.id.desc()).limit(1))).scalar_one()
        await session.execute(update(AuditHead).values(hash=last, count=kept))
        await session.commit()


async def forbidden_calls(api: Api, count: int) -> None:
    for _ in range(count):
        assert (await api.get("/api/audit", role="operator")).status_code == 403


async def test_the_head_is_the_last_entrys_hash_and_the_count(api: Api) -> None:
    assert (await api.get("/api/audit/head", role="admin")).json() == {"hash": GENESIS,
                                                                         "count": 0}
    await forbidden_calls(api, 3)
    head = (await api.get("/api/audit/head", role="admin")).json()
    [last] = (await api.audit())[-1:]
    assert head == {"hash": last.hash, "count": 3}
    assert (await api.get("/api/audit/head", role="operator")).status_code == 403


async def test_a_cut_off_tail_with_a_rewritten_head_is_found_against_the_anchor(
        api: Api) -> None:
    await forbidden_calls(api, 5)
    anchor = (await api.get("/api/audit/head", role="admin")).json()["hash"]
    page = (await api.get("/api/audit", role="admin", anchor=anchor)).json()
    assert page["chain"] == {"ok": True, "entries": 5, "reason": "", "bad_id": None}
    await cut_the_tail(api.runtime.store, 2)
    # The chain alone cannot tell: it is consistent again.
    alone = (await api.get("/api/audit", role="admin", verify=True)).json()["chain"]
    assert alone["ok"] is True
    anchored = (await api.get("/api/audit", role="admin", anchor=anchor)).json()["chain"]
    assert anchored["ok"] is False
    assert anchored["reason"].startswith(f"the anchored head {anchor} is not in the chain")
    # An anchor still in the chain holds.
    assert (await api.get("/api/audit", role="admin", anchor=GENESIS)).json()["chain"]["ok"]


async def test_an_anchor_must_be_a_chain_hash(api: Api) -> None:
    for bad in ("abc", "Z" * 64, "0" * 63):
        assert (await api.get("/api/audit", role="admin", anchor=bad)).status_code == 422
