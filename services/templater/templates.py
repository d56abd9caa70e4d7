"""Task templates: YAML files validated on load, and the pure planning of a task from a need."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated
from uuid import NAMESPACE_URL, uuid5

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from schemas.events.v1 import Action, ActionName, NeedKind, OpsNeed, OpsTask, Step

TEMPLATE_DIR = Path(__file__).parent / "templates"
_IDS = uuid5(NAMESPACE_URL, "clusterwarden/templater")
_ACTION = TypeAdapter[Action](Action)


class TemplateError(ValueError):
    """A template file is invalid; the message names the file and the field."""


class StepTemplate(BaseModel):
    """One step of a template: a typed action whose parameters come from the need."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    action: ActionName
    timeout_s: float = Field(default=60.0, gt=0.0, le=86_400.0)
    max_attempts: int = Field(default=3, ge=1, le=10)


class Template(BaseModel):
    """A task template: which need it serves, its priority, locks and ordered steps."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    version: int = Field(ge=1)
    need: NeedKind
    description: str = Field(max_length=500)
    priority: int = Field(ge=0, le=9)
    mutex: list[str] = Field(min_length=1, max_length=16)
    steps: list[StepTemplate] = Field(min_length=1, max_length=64)


def load_template(path: Path) -> Template:
    """Read and validate one template file."""
    try:
        data = yaml.safe_load(path.read_text())
        return Template.model_validate(data)
    except ValidationError as err:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()
        )
        raise TemplateError(f"{path.name}: {fields}") from err
    except yaml.YAMLError as err:
        raise TemplateError(f"{path.name}: not valid YAML: {err}") from err


def load_templates(directory: Path = TEMPLATE_DIR) -> dict[NeedKind, Template]:
    """Every template in `directory`, by the need it serves; two for one need is an error."""
    by_need: dict[NeedKind, Template] = {}
    for path in sorted(directory.glob("*.yaml")):
        template = load_template(path)
        if template.need in by_need:
            raise TemplateError(f"{path.name}: a second template for need {template.need!r}")
        by_need[template.need] = template
    return by_need


def plan(template: Template, need: OpsNeed, now: datetime, source: str,
         dry_run: bool = False) -> OpsTask:
    """The task a template makes for a need (deterministic: the same need, the same task)."""
    params = {"target": need.target, "cluster": need.cluster_id, "pool": need.pool}
    task_id = uuid5(_IDS, f"task:{need.event_id}:{template.name}:{template.version}")
    steps = [
        Step(
            index=i,
            name=s.name,
            action=_ACTION.validate_python({"action": s.action, "node_id": need.target}),
            timeout_s=s.timeout_s,
            max_attempts=s.max_attempts,
        )
        for i, s in enumerate(template.steps)
    ]
    return OpsTask(
        event_id=uuid5(_IDS, f"event:{task_id}"),
        source=source,
        occurred_at=now,
        cluster_id=need.cluster_id,
        subject=str(task_id),
        correlation_id=str(need.event_id),
        task_id=task_id,
        need_id=need.event_id,
        need_kind=need.kind,
        template=f"{template.name}.v{template.version}",
        pool=need.pool,
        target=need.target,
        priority=template.priority,
        mutex_keys=[m.format(**params) for m in template.mutex],
        dry_run=dry_run,
        steps=steps,
        evidence=list(need.evidence),
    )
