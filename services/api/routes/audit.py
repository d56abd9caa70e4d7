"""The audit log (admin): newest first, with the chain's verification; and its head, to be
kept apart from the store and named again in a later verification (`anchor`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field, StringConstraints

from services.api.deps import Admin, RuntimeDep
from services.store.queries import MAX_PAGE, audit_head, audit_verdict, list_audit
from services.store.views import AuditRow

router = APIRouter(prefix="/api/audit", tags=["audit"])

ChainHash = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class HeadOut(BaseModel):
    hash: str = Field(description="The last entry's chain hash (64 zeros: no entry yet).")
    count: int = Field(description="How many entries the chain holds.")


class ChainOut(BaseModel):
    ok: bool
    entries: int
    reason: str = ""
    bad_id: str | None = None


class AuditPage(BaseModel):
    items: list[AuditRow]
    total: int
    limit: int
    offset: int
    chain: ChainOut | None = Field(description="The hash chain, checked from its first "
                                               "entry (when asked with verify=true).")


@router.get("", response_model=AuditPage, summary="The audit log, newest first (admin)")
async def audit_log(
    rt: RuntimeDep, _: Admin,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
    verify: Annotated[bool, Query(description="Recompute the whole chain.")] = False,
    anchor: Annotated[ChainHash | None, Query(
        description="A head exported earlier (`/api/audit/head`): the chain must still hold "
                    "its entry (implies verify).")] = None,
) -> AuditPage:
    async with rt.store.session() as session:
        rows, total = await list_audit(session, limit, offset)
        verdict = (await audit_verdict(session, anchor)
                   if verify or anchor is not None else None)
    chain = None if verdict is None else ChainOut(
        ok=verdict.ok, entries=verdict.entries, reason=verdict.reason, bad_id=verdict.bad_id)
    return AuditPage(items=rows, total=total, limit=limit, offset=offset, chain=chain)


@router.get("/head", response_model=HeadOut, summary="The audit chain's head (admin)")
async def audit_chain_head(rt: RuntimeDep, _: Admin) -> HeadOut:
    """Keep it apart from the store (a ticket, a log elsewhere): a later verification with it
    as `anchor` finds a tail cut off even when the head was rewritten to match."""
    async with rt.store.session() as session:
        head = await audit_head(session)
    return HeadOut(hash=head.hash, count=head.count)
