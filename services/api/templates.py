"""What the API shows of templates, read from the task store's versions.

The store is the source of truth (services/store/template_versions.py): the API and the
templater share it through DATABASE_URL, so an edit saved through the API reaches every
templater, in one process or across hosts (compose), by the change event and the templater's
periodic re-read. The built-in templates (or TEMPLATER_TEMPLATE_DIR's) are only the seed of a
store that lacks them.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from services.store.template_versions import StateRow, VersionRow
from services.templater.templates import TEMPLATE_DIR
from services.templater.validation import TemplateInvalid, check_text


class TemplateSummary(BaseModel):
    """A template as listed: its active version, where that came from, and its pin."""

    file: str
    name: str
    version: int | None = None
    need: str | None = None
    description: str = ""
    priority: int | None = None
    steps: int = 0
    error: str | None = None
    origin: str | None = None
    updated_at: datetime | None = None
    pinned: bool = False
    pinned_by: str | None = None
    pin_reason: str | None = None
    tunable: bool = False


class TemplateDocument(BaseModel):
    """One template's active version: its YAML text and its parsed form."""

    file: str
    name: str
    yaml: str
    sha256: str
    version: int
    origin: str
    pinned: bool = False
    template: dict[str, Any] | None = None
    error: str | None = None


def seed_folder(template_dir: str) -> Path:
    """The templates seeded into a store that lacks them."""
    return Path(template_dir) if template_dir else TEMPLATE_DIR


def templater_env(template_dir: str, state_dir: str) -> dict[str, str]:
    """What `warden up` passes the services about templates: the seed folder, when one was
    chosen (the store itself is DATABASE_URL, or the state folder's warden.db for all)."""
    del state_dir  # every service finds the same default store in it
    return {"TEMPLATER_TEMPLATE_DIR": template_dir} if template_dir else {}


def summary(row: VersionRow, state: StateRow | None) -> TemplateSummary:
    listed = TemplateSummary(
        file=f"{row.name}.yaml", name=row.name, version=row.version, origin=row.origin,
        updated_at=state.updated_at if state else row.created_at,
        pinned=bool(state and state.pinned), pinned_by=state.pinned_by if state else None,
        pin_reason=state.pin_reason if state else None)
    try:
        template = check_text(row.yaml, row.name)
    except TemplateInvalid as err:
        return listed.model_copy(update={"error": str(err)})
    return listed.model_copy(update={
        "need": template.need, "description": template.description,
        "priority": template.priority, "steps": len(template.steps),
        "tunable": template.tuning is not None})


def document(row: VersionRow, state: StateRow | None) -> TemplateDocument:
    shown = TemplateDocument(file=f"{row.name}.yaml", name=row.name, yaml=row.yaml,
                             sha256=row.sha256, version=row.version, origin=row.origin,
                             pinned=bool(state and state.pinned))
    try:
        template = check_text(row.yaml, row.name)
    except TemplateInvalid as err:
        return shown.model_copy(update={"error": str(err)})
    return shown.model_copy(update={"template": template.model_dump(mode="json")})
