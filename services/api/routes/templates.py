"""Templates: list, show, validate (operator) and save (admin), with the templater's rules."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Request, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from services.api import templates
from services.api.bodies import Reason
from services.api.deps import Admin, Operator, RuntimeDep, Viewer, audit, client_detail
from services.api.templates import (
    MAX_TEMPLATE_BYTES,
    Problem,
    TemplateDocument,
    TemplateInvalid,
    TemplateSummary,
)

router = APIRouter(prefix="/api/templates", tags=["templates"])
Name = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,32}$")]


class TemplateText(BaseModel):
    model_config = ConfigDict(extra="forbid")

    yaml: str = Field(max_length=MAX_TEMPLATE_BYTES, description="The template as YAML.")


class TemplateEdit(TemplateText):
    reason: Reason


class Validated(BaseModel):
    valid: bool = True
    template: dict[str, Any]


class Invalid(BaseModel):
    """422: what is wrong, field by field."""

    message: str
    problems: list[Problem]


class SavedOut(BaseModel):
    saved: bool
    file: str
    sha256: str
    previous_sha256: str | None
    template: dict[str, Any]
    note: str


def invalid(err: TemplateInvalid) -> JSONResponse:
    body = Invalid(message=str(err), problems=err.problems)
    return JSONResponse(status_code=status.HTTP_422_UNPROCESSABLE_CONTENT,
                        content={"detail": body.model_dump()})


@router.get("", response_model=list[TemplateSummary], summary="Every template file")
async def templates_list(rt: RuntimeDep, _: Viewer) -> list[TemplateSummary]:
    return await asyncio.to_thread(templates.list_templates, rt.template_folder)


@router.get("/{name}", response_model=TemplateDocument, summary="One template, YAML and parsed")
async def templates_show(name: Name, rt: RuntimeDep, _: Viewer) -> TemplateDocument:
    document = await asyncio.to_thread(templates.read_template, rt.template_folder, name)
    if document is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no template {name}")
    return document


@router.post("/validate", response_model=Validated,
             responses={422: {"model": Invalid, "description": "Invalid, field by field"}},
             summary="Check a template as it would be saved (operator)")
async def templates_validate(body: TemplateText, rt: RuntimeDep,
                             _: Operator) -> Validated | JSONResponse:
    try:
        template = await asyncio.to_thread(templates.check, rt.template_folder, body.yaml)
    except TemplateInvalid as err:
        return invalid(err)
    return Validated(template=template.model_dump(mode="json"))


@router.put("/{name}", response_model=SavedOut,
            responses={422: {"model": Invalid, "description": "Invalid, field by field"}},
            summary="Save a template after validating it (admin)")
async def templates_save(name: Name, body: TemplateEdit, request: Request, rt: RuntimeDep,
                         who: Admin) -> SavedOut | JSONResponse:
    target = f"template/{name}"
    detail = client_detail(request)
    # One save at a time: each is checked against the folder as the one before left it.
    async with rt.template_lock:
        try:
            saved = await asyncio.to_thread(templates.prepare, rt.template_folder, name,
                                            body.yaml)
        except TemplateInvalid as err:
            await audit(rt, who, "template_save", target, body.reason, "422 invalid",
                        detail | {"problems": [p.model_dump() for p in err.problems]})
            return invalid(err)
        # Audited before it is written: no template changes without its entry.
        await audit(rt, who, "template_save", target, body.reason,
                    f"saved {saved.template.label}" if saved.changed else "unchanged",
                    detail | {"file": saved.file.name, "sha256": saved.sha256,
                              "previous_sha256": saved.previous_sha256})
        await asyncio.to_thread(templates.write, saved, body.yaml)
    return SavedOut(
        saved=saved.changed, file=saved.file.name, sha256=saved.sha256,
        previous_sha256=saved.previous_sha256, template=saved.template.model_dump(mode="json"),
        note="the templater loads its templates when it starts: restart it to use this one"
        if saved.changed else "identical to the saved template: nothing written",
    )
