"""The audit log (admin): newest first, with the chain's verification (its head's MAC under
the audit key included); its head, to be kept apart from the store and named again in a later
verification (`anchor`); and the head keyed again once an admin has checked the log."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, status
from pydantic import BaseModel, Field, StringConstraints

from schemas.envelope import reason_text
from services.api.bodies import ReasonBody
from services.api.deps import Admin, RuntimeDep, audit, client_detail
from services.store.queries import (
    MAX_PAGE,
    append_audit,
    audit_head,
    audit_verdict,
    key_audit_head,
    list_audit,
)
from services.store.views import AuditRow

router = APIRouter(prefix="/audit", tags=["audit"])

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
        description="A head exported earlier (`/api/v1/audit/head`): the chain must still hold "
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


class KeyHeadRequest(ReasonBody):
    head: ChainHash = Field(description="The head's hash as checked (`/api/v1/audit/head`): "
                                        "keyed only if it is still the head.")


@router.post("/head/key", response_model=HeadOut,
             summary="Key the audit chain's head after checking the log (admin; audited)")
async def key_chain_head(body: KeyHeadRequest, request: Request, rt: RuntimeDep,
                         who: Admin) -> HeadOut:
    """For a head the audit key does not vouch for: one from before the key was set, or one
    an append left unkeyed because the head before it had failed. The chain must recompute to
    `head`; check it first against a head kept apart, since a tail cut off before is keyed
    too. Keyed and audited in one transaction; returns the head after that entry (keep it
    apart as the new anchor). 409 if the chain is broken or the head is another."""
    detail = client_detail(request) | {"head": body.head}
    async with rt.store.session() as session:
        verdict = await key_audit_head(session, body.head)
        if verdict.ok:
            await append_audit(session, actor=who.user, role=who.role, action="audit_head_key",
                               target="audit/head", reason=reason_text(body.reason),
                               result=f"keyed at {verdict.entries} entries", detail=detail)
            head = await audit_head(session)
            return HeadOut(hash=head.hash, count=head.count)
    await audit(rt, who, "audit_head_key", "audit/head", body.reason, f"409 {verdict.reason}",
                detail)
    raise HTTPException(status.HTTP_409_CONFLICT, verdict.reason)
