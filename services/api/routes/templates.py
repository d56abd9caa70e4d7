"""Templates: list, show, validate (operator), save and roll back (admin), pin and unpin
(operator), history and diffs (viewer). Every change goes through the task store's one save
path (services/store/template_versions.py) and reaches the running templaters."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request, status
from pydantic import BaseModel, ConfigDict, Field

from services.api import templates
from services.api.bodies import Reason
from services.api.deps import Admin, Operator, RuntimeDep, Viewer, audit, client_detail
from services.api.problems import INVALID_TEMPLATE, ApiProblem, ProblemDocument
from services.api.templates import TemplateDocument, TemplateSummary
from services.store.template_versions import (
    Saved,
    SaveRequest,
    StateRow,
    UnknownVersion,
    VersionRow,
    active_rows,
    history,
    state_of,
    states,
    version_of,
)
from services.templater.validation import (
    MAX_TEMPLATE_BYTES,
    Problem,
    TemplateInvalid,
    check_set,
    check_text,
    unified_diff,
    with_version,
)

router = APIRouter(prefix="/templates", tags=["templates"])
Name = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,32}$")]
VersionNo = Annotated[int, Query(ge=1, le=1_000_000)]


class TemplateText(BaseModel):
    model_config = ConfigDict(extra="forbid")

    yaml: str = Field(max_length=MAX_TEMPLATE_BYTES, description="The template as YAML.")


class TemplateEdit(TemplateText):
    reason: Reason


class RollbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1, description="The version whose text becomes the next version.")
    reason: Reason


class PinBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Reason


class Validated(BaseModel):
    valid: bool = True
    template: dict[str, Any]


class Invalid(ProblemDocument):
    """422 (problem details of type invalid-template): what is wrong, field by field."""

    problems: list[Problem]


class SavedOut(BaseModel):
    saved: bool
    file: str
    version: int
    previous_version: int | None
    sha256: str
    origin: str
    template: dict[str, Any]
    note: str


class History(BaseModel):
    name: str
    active_version: int
    pinned: bool
    pinned_by: str | None
    pin_reason: str | None
    versions: list[VersionRow]


class Diff(BaseModel):
    name: str
    from_version: int
    to_version: int
    diff: str


INVALID: dict[int | str, dict[str, Any]] = {
    422: {"model": Invalid, "description": "Invalid, field by field"}}


def invalid(err: TemplateInvalid) -> ApiProblem:
    return ApiProblem(status.HTTP_422_UNPROCESSABLE_CONTENT, str(err), INVALID_TEMPLATE,
                      problems=[p.model_dump() for p in err.problems])


def saved_out(saved: Saved, note: str) -> SavedOut:
    return SavedOut(
        saved=saved.changed, file=f"{saved.version.name}.yaml", version=saved.version.version,
        previous_version=saved.previous_version, sha256=saved.version.sha256,
        origin=saved.version.origin, template=saved.template.model_dump(mode="json"),
        note=note)


async def _history(rt: RuntimeDep, name: str) -> tuple[StateRow, list[VersionRow]]:
    async with rt.store.session() as session:
        state = await state_of(session, name)
        versions = await history(session, name)
    if state is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no template {name}")
    return state, versions


@router.get("", response_model=list[TemplateSummary], summary="Every template, its active "
            "version and pin")
async def templates_list(rt: RuntimeDep, _: Viewer) -> list[TemplateSummary]:
    async with rt.store.session() as session:
        active = await active_rows(session)
        pins = {s.name: s for s in await states(session)}
    return await asyncio.to_thread(
        lambda: [templates.summary(row, pins.get(name)) for name, row in active.items()])


@router.get("/{name}", response_model=TemplateDocument, summary="One template's active "
            "version, YAML and parsed")
async def templates_show(name: Name, rt: RuntimeDep, _: Viewer) -> TemplateDocument:
    async with rt.store.session() as session:
        row = (await active_rows(session)).get(name)
        state = await state_of(session, name)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no template {name}")
    return await asyncio.to_thread(templates.document, row, state)


@router.post("/validate", response_model=Validated, responses=INVALID,
             summary="Check a template as it would be saved (operator)")
async def templates_validate(body: TemplateText, rt: RuntimeDep,
                             _: Operator) -> Validated:
    async with rt.store.session() as session:
        active = {n: r.yaml for n, r in (await active_rows(session)).items()}

    def check() -> dict[str, Any]:
        template = check_text(body.yaml)
        # As it would join the active set, in place of the template of its name.
        check_set({**active, template.name: with_version(body.yaml, template.version)})
        return template.model_dump(mode="json")

    try:
        return Validated(template=await asyncio.to_thread(check))
    except TemplateInvalid as err:
        raise invalid(err) from err


@router.put("/{name}", response_model=SavedOut, responses=INVALID,
            summary="Save a template as its next version after validating it (admin)")
async def templates_save(name: Name, body: TemplateEdit, request: Request, rt: RuntimeDep,
                         who: Admin) -> SavedOut:
    try:
        saved = await rt.templates.save(SaveRequest(
            name=name, text=body.yaml, origin="manual", actor=who.user, role=who.role,
            reason=body.reason))
    except TemplateInvalid as err:
        await audit(rt, who, "template_save", f"template/{name}", body.reason, "422 invalid",
                    client_detail(request) | {"problems": [p.model_dump() for p in err.problems]})
        raise invalid(err) from err
    return saved_out(saved, f"saved as {saved.template.label}; the templaters use it from "
                     "their next need" if saved.changed
                     else "identical to the active version: nothing saved")


@router.get("/{name}/history", response_model=History,
            summary="Every version of a template, newest first")
async def templates_history(name: Name, rt: RuntimeDep, _: Viewer) -> History:
    state, versions = await _history(rt, name)
    return History(name=name, active_version=state.active_version, pinned=state.pinned,
                   pinned_by=state.pinned_by, pin_reason=state.pin_reason, versions=versions)


@router.get("/{name}/diff", response_model=Diff,
            summary="The unified diff of a template's YAML between two versions")
async def templates_diff(name: Name, rt: RuntimeDep, _: Viewer,
                         a: Annotated[VersionNo, Query(alias="from")],
                         b: Annotated[VersionNo, Query(alias="to")]) -> Diff:
    async with rt.store.session() as session:
        old = await version_of(session, name, a)
        new = await version_of(session, name, b)
    if old is None or new is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            f"template {name} has no version {a if old is None else b}")
    return Diff(name=name, from_version=a, to_version=b,
                diff=unified_diff(old.yaml, new.yaml, f"{name}.v{a}", f"{name}.v{b}"))


@router.post("/{name}/rollback", response_model=SavedOut, responses=INVALID,
             summary="Make a new version equal to an earlier one (admin)")
async def templates_rollback(name: Name, body: RollbackBody, request: Request,
                             rt: RuntimeDep, who: Admin) -> SavedOut:
    try:
        saved = await rt.templates.rollback(name, body.version, who.user, who.role,
                                            body.reason)
    except UnknownVersion as err:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(err)) from err
    except TemplateInvalid as err:
        await audit(rt, who, "template_rollback", f"template/{name}", body.reason,
                    "422 invalid", client_detail(request)
                    | {"problems": [p.model_dump() for p in err.problems]})
        raise invalid(err) from err
    return saved_out(saved, f"version {body.version} is active again as "
                     f"{saved.template.label}" if saved.changed
                     else f"the active version already equals version {body.version}")


async def _pin(name: str, pinned: bool, body: PinBody, rt: RuntimeDep,
               who: Operator) -> StateRow:
    try:
        return await rt.templates.pin(name, pinned, who.user, who.role, body.reason)
    except UnknownVersion as err:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(err)) from err


@router.post("/{name}/pin", response_model=StateRow,
             summary="Pin a template: the tuner leaves it alone (operator)")
async def templates_pin(name: Name, body: PinBody, rt: RuntimeDep, who: Operator) -> StateRow:
    return await _pin(name, True, body, rt, who)


@router.post("/{name}/unpin", response_model=StateRow,
             summary="Unpin a template: the tuner may tune it again (operator)")
async def templates_unpin(name: Name, body: PinBody, rt: RuntimeDep,
                          who: Operator) -> StateRow:
    return await _pin(name, False, body, rt, who)
