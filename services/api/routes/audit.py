"""The audit log (admin): newest first, with the chain's verification."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from services.api.deps import Admin, RuntimeDep
from services.store.queries import MAX_PAGE, audit_verdict, list_audit
from services.store.views import AuditRow

router = APIRouter(prefix="/api/audit", tags=["audit"])


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
) -> AuditPage:
    async with rt.store.session() as session:
        rows, total = await list_audit(session, limit, offset)
        verdict = await audit_verdict(session) if verify else None
    chain = None if verdict is None else ChainOut(
        ok=verdict.ok, entries=verdict.entries, reason=verdict.reason, bad_id=verdict.bad_id)
    return AuditPage(items=rows, total=total, limit=limit, offset=offset, chain=chain)
