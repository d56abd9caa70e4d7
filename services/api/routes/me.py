"""Who the caller is: the console shows only the actions the caller's role allows."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from services.api.deps import Viewer

router = APIRouter(prefix="/me", tags=["auth"])


class MeOut(BaseModel):
    user: str
    role: str


@router.get("", response_model=MeOut, summary="The caller's user and role")
async def me(principal: Viewer) -> MeOut:
    return MeOut(user=principal.user, role=principal.role)
