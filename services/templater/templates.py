"""Task templates: YAML files validated on load, the registry by need, and pure planning.

A template is checked completely when it is loaded, with placeholder values standing in for
the need: every step's action and arguments against `StepAction`, every placeholder, every
guard. A typo stops the templater at start with the file and the field named, instead of
failing a task at 3 a.m.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, get_args
from uuid import uuid5

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from schemas import ids
from schemas.events.v1 import (
    AddCapacity,
    BreakerScope,
    Dependency,
    ExclusiveWith,
    Guard,
    MigrateJobs,
    NeedKind,
    OnFailure,
    OpsNeed,
    OpsTask,
    RelationScope,
    RemoveCapacity,
    Step,
    StepAction,
    StepActionName,
    TaskRelations,
)
from services.templater.placeholders import (
    NEED_FIELDS,
    Arg,
    Scalar,
    arg_texts,
    placeholders,
    render_arg,
    render_text,
    unknown_placeholders,
)
from services.templater.tuning_spec import Tuning, tuning_problems

TEMPLATE_DIR = Path(__file__).parent / "templates"
_STEP_ACTION = TypeAdapter[StepAction](StepAction)
# The scheduler's limit on the locks of one task (OpsTask.mutex_keys).
MAX_LOCK_KEYS = 16
_LOCK_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
# Stand-ins for the need's fields when a template is checked at load time.
_SAMPLE_NEED: dict[str, Scalar] = {
    "cluster": "sample-cluster", "pool": "sample-pool", "target": "sample-target",
}
# StepActionName is a union of Literals, whose own error lists each member apart: name them once.
_ACTION_NAMES: tuple[str, ...] = tuple(
    name for part in get_args(StepActionName) for name in get_args(part)
)
# Sent by the executor itself about an earlier command; a template cannot know that command.
_NOT_IN_TEMPLATES: frozenset[str] = frozenset({"query_status", "cancel"})

# No dots in template names: they name Redis keys and relations, which must stay unambiguous;
# 32 characters leave room for the cluster id within an identifier's 128.
TemplateName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,32}$")]
StepName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
ParamName = Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_]{0,63}$")]
ParamValue = StrictBool | StrictInt | StrictFloat | StrictStr
StepArg = StrictBool | StrictInt | StrictFloat | StrictStr | None
# One level of named values, for an action's small settings (online_node's health_check).
StepArgs = StepArg | Annotated[dict[str, StepArg], Field(max_length=8)]


class TemplateError(ValueError):
    """A template file is invalid; the message names the file and the field."""


class PlanError(ValueError):
    """A need cannot be planned with a template (its values do not make a valid task)."""


class StepTemplate(BaseModel):
    """One step: a typed action whose arguments may name the need's fields and parameters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: StepName
    action: StepActionName
    args: dict[str, StepArgs] = Field(default_factory=dict, max_length=16)
    guard: Guard | None = None
    timeout_s: float = Field(default=60.0, gt=0.0, le=86_400.0)
    max_attempts: int | None = Field(
        default=None, ge=1, le=10, description="None: the template's retry.max_attempts."
    )
    execution_count: int | None = Field(
        default=None, ge=0, le=10_000, description="How many ops the step executes; None: "
        "from its action (see `step_execution_count`).")

    @field_validator("action", mode="before")
    @classmethod
    def _known_action(cls, value: object) -> object:
        if value not in _ACTION_NAMES:
            allowed = ", ".join(n for n in _ACTION_NAMES if n not in _NOT_IN_TEMPLATES)
            raise PydanticCustomError(
                "unknown_action", "unknown action '{action}' (one of: {allowed})",
                {"action": value, "allowed": allowed},
            )
        return value


def _bare_name(value: object) -> object:
    """A relation written as a bare name means its defaults (scope cluster, fail)."""
    return {"template": value} if isinstance(value, str) else value


class RelationRule(BaseModel):
    """A relation to another template's tasks within a scope (cluster, pool or target)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    template: TemplateName
    scope: RelationScope = "cluster"

    @model_validator(mode="before")
    @classmethod
    def _bare(cls, value: object) -> object:
        return _bare_name(value)


class ExclusiveRule(RelationRule):
    """A template whose running tasks hold this one's back, and the other way round."""


class DependsOnRule(RelationRule):
    """A template whose tasks (open when this one is queued) must finish before it starts."""

    on_failure: OnFailure = "fail"


class Relations(BaseModel):
    """How a template's tasks stand to other templates' tasks (names or need kinds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    concurrent_with: list[TemplateName] = Field(default_factory=list, max_length=16)
    exclusive_with: list[ExclusiveRule] = Field(default_factory=list, max_length=16)


class RetryPolicy(BaseModel):
    """Attempts per step unless the step sets its own. The backoff between attempts is the
    executor's (no task field carries a per-template backoff yet)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(default=3, ge=1, le=10)


class Template(BaseModel):
    """A task template: the need it serves, its priority, locks, limits and ordered steps."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: TemplateName
    version: int = Field(ge=1)
    need: NeedKind
    description: str = Field(max_length=500)
    priority: int = Field(ge=0, le=9)
    parameters: dict[ParamName, ParamValue] = Field(default_factory=dict, max_length=32)
    mutex: list[str] = Field(min_length=1, max_length=MAX_LOCK_KEYS)
    execution_count: int | None = Field(
        default=None, ge=0, le=10_000, description="How many ops a run executes (nodes taken "
        "offline, nodes added, jobs moved); None: the sum of its steps' counts, unknown until "
        "run time if one of them is.")
    concurrency: int = Field(default=1, ge=1, le=1024, description="At most this many tasks "
                             "of the template run at once per cluster.")
    relations: Relations = Field(default_factory=Relations)
    depends_on: list[DependsOnRule] = Field(default_factory=list, max_length=16)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    breaker_scope: BreakerScope | None = Field(
        default=None, description="What its tasks' breaker stops when it opens (kind, node, "
        "cluster); None: the scheduler's setting for the kind.")
    steps: list[StepTemplate] = Field(min_length=1, max_length=64)
    tuning: Tuning | None = Field(default=None, description="Opt-in self-tuning of one "
                                  "parameter (services/tuner/).")

    # Filled by `load_templates`, which alone sees the other templates; None: not resolved.
    _resolved: TaskRelations | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check(self) -> Template:
        problems = template_problems(self)
        if problems:
            # One error naming every field at fault (custom type: no "Value error," prefix).
            raise PydanticCustomError("template", "{problems}", {"problems": "; ".join(problems)})
        return self

    @property
    def label(self) -> str:
        """How tasks name their template: name and version."""
        return f"{self.name}.v{self.version}"

    @property
    def task_relations(self) -> TaskRelations:
        """The resolved relations its tasks carry; a template with relations must come from
        a registry (names resolved, exclusions and concurrency made symmetric)."""
        if self._resolved is not None:
            return self._resolved
        if self.relations.exclusive_with or self.relations.concurrent_with or self.depends_on:
            raise TemplateError(
                f"template {self.name}: its relations are resolved by load_templates, "
                "which sees the other templates"
            )
        return TaskRelations(template=self.name, concurrency=self.concurrency)

    def with_relations(self, relations: TaskRelations) -> Template:
        """A copy with its relations resolved (the original is left alone)."""
        resolved = self.model_copy()
        resolved._resolved = relations
        return resolved


def template_problems(template: Template) -> list[str]:
    """Everything wrong with a template that field types cannot say, as `field.path: why`."""
    problems: list[str] = []
    need_fields = set(NEED_FIELDS)
    for name in template.parameters:
        if name in need_fields:
            problems.append(f"parameters.{name}: reserved (filled in from the need)")
    for i, pattern in enumerate(template.mutex):
        problems += _lock_pattern_problems(f"mutex.{i}", pattern, need_fields)

    known = need_fields | set(template.parameters)
    values = {**template.parameters, **_SAMPLE_NEED}
    used: set[str] = set()
    seen: dict[str, int] = {}
    for i, step in enumerate(template.steps):
        path = f"steps.{i}"
        if step.name in seen:
            problems.append(f"{path}.name: {step.name!r} repeats steps.{seen[step.name]}.name")
        seen.setdefault(step.name, i)
        step_problems, step_used = _step_problems(path, step, known, values)
        problems += step_problems
        used |= step_used

    for name in template.parameters:
        if name not in used:
            problems.append(f"parameters.{name}: not used by any step")
    problems += _relation_problems(template)
    problems += tuning_problems(template.tuning, dict(template.parameters))
    return problems


def _lock_pattern_problems(path: str, pattern: str, known: set[str]) -> list[str]:
    try:
        unknown = unknown_placeholders(pattern, known)
    except ValueError as err:
        return [f"{path}: {err}"]
    if unknown:
        return [f"{path}: unknown placeholder {{{unknown[0]}}} (a lock key may use "
                f"{', '.join('{' + k + '}' for k in sorted(known))})"]
    if "cluster" not in placeholders(pattern):
        # Two clusters may name their nodes alike: a lock without its cluster is shared.
        return [f"{path}: {pattern!r} does not name {{cluster}} (a lock is scoped by its "
                f"cluster, e.g. 'node.{{cluster}}.{{target}}')"]
    if not _LOCK_KEY.match(render_text(pattern, _SAMPLE_NEED)):
        return [f"{path}: {pattern!r} does not make a lock key (letters, digits, '_.-')"]
    return []


def _step_problems(
    path: str, step: StepTemplate, known: set[str], values: Mapping[str, Scalar]
) -> tuple[list[str], set[str]]:
    problems: list[str] = []
    used: set[str] = set()
    if step.action in _NOT_IN_TEMPLATES:
        problems.append(f"{path}.action: {step.action} is sent by the executor itself, "
                        "not planned")
    if "action" in step.args:
        problems.append(f"{path}.args.action: set by the step's `action`, not an argument")
    for field, value in (t for f, v in step.args.items() for t in arg_texts(f, v)):
        try:
            names = placeholders(value)
        except ValueError as err:
            problems.append(f"{path}.args.{field}: {err}")
            continue
        unknown = [name for name in names if name not in known]
        if unknown:
            problems.append(f"{path}.args.{field}: unknown placeholder {{{unknown[0]}}} "
                            f"(known: {', '.join(sorted(known))})")
        used.update(names)
    if problems:
        return problems, used

    # The action as it will be planned, with stand-in values: a wrong field, type or bound is
    # a load error here rather than a failed task later.
    try:
        action = _STEP_ACTION.validate_python(_action_input(step, values))
    except ValidationError as err:
        for e in err.errors():
            field = ".".join(str(p) for p in e["loc"][1:])  # loc[0] is the action's tag
            problems.append(f"{path}.args{'.' + field if field else ''}: {e['msg']}")
        return problems, used
    if step.guard == "node_has_jobs" and getattr(action, "node_id", None) is None:
        problems.append(f"{path}.guard: node_has_jobs needs a step that names its node "
                        "(args.node_id)")
    return problems, used


def _relation_problems(template: Template) -> list[str]:
    problems: list[str] = []
    lists = {
        "relations.concurrent_with": template.relations.concurrent_with,
        "relations.exclusive_with": [r.template for r in template.relations.exclusive_with],
        "depends_on": [r.template for r in template.depends_on],
    }
    for field, names in lists.items():
        for i, name in enumerate(names):
            if name in (template.name, template.need):
                problems.append(f"{field}.{i}: a template cannot relate to itself "
                                "(concurrency limits its own tasks)")
    excluded = set(lists["relations.exclusive_with"])
    for i, name in enumerate(template.relations.concurrent_with):
        if name in excluded:
            problems.append(f"relations.concurrent_with.{i}: {name} is also in "
                            "relations.exclusive_with")
    return problems


def step_execution_count(action: StepAction) -> int | None:
    """How many ops a step executes, from its action: nodes added or removed (0: computed at
    run time, None), at most `max_jobs` jobs moved, one node for any other action."""
    if isinstance(action, AddCapacity | RemoveCapacity):
        return action.nodes or None
    if isinstance(action, MigrateJobs):
        return action.max_jobs
    return 1


def _action_input(step: StepTemplate, values: Mapping[str, Scalar]) -> dict[str, Arg]:
    return {**{k: render_arg(v, values) for k, v in step.args.items()}, "action": step.action}


# ---------------------------------------------------------------- loading and the registry


def load_template(path: Path) -> Template:
    """Read and validate one template file (its relations are resolved by `load_templates`)."""
    try:
        data: Any = yaml.safe_load(path.read_text())
        if data is None:
            raise TemplateError(f"{path.name}: empty, a template is expected")
        return Template.model_validate(data)
    except ValidationError as err:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" if e["loc"] else e["msg"]
            for e in err.errors()
        )
        raise TemplateError(f"{path.name}: {fields}") from err
    except yaml.YAMLError as err:
        raise TemplateError(f"{path.name}: not valid YAML: {err}") from err
    except OSError as err:
        raise TemplateError(f"{path.name}: cannot be read: {err}") from err


def load_templates(directory: Path = TEMPLATE_DIR) -> dict[NeedKind, Template]:
    """Every template in `directory`, by the need it serves, relations resolved.

    One template per need kind; two for one need, two with one name, a relation to a template
    that is not there, or a concurrent_with that an exclusive_with contradicts is an error
    naming file and field.
    """
    paths = sorted(directory.glob("*.yaml"))
    if not paths:
        raise TemplateError(f"{directory}: no *.yaml templates")
    by_need: dict[NeedKind, Template] = {}
    by_name: dict[str, Template] = {}
    file_of: dict[str, str] = {}
    for path in paths:
        template = load_template(path)
        if template.need in by_need:
            first = file_of[by_need[template.need].name]
            raise TemplateError(
                f"{path.name}: need: a second template for need {template.need!r} "
                f"(the first is {first})"
            )
        if template.name in by_name:
            raise TemplateError(f"{path.name}: name: a second template named "
                                f"{template.name!r} (the first is {file_of[template.name]})")
        by_need[template.need] = by_name[template.name] = template
        file_of[template.name] = path.name

    return {need: template.with_relations(_resolve_relations(template, by_name, by_need,
                                                             file_of))
            for need, template in by_need.items()}


def _resolve_relations(template: Template, by_name: Mapping[str, Template],
                       by_need: Mapping[NeedKind, Template],
                       file_of: Mapping[str, str]) -> TaskRelations:
    """The relations a template's tasks carry: names resolved; an exclusion or a
    concurrent_with declared on either side holds on both (a task checks only its own)."""
    file = file_of[template.name]
    exclusive: dict[tuple[str, RelationScope], None] = {}
    concurrent: dict[str, None] = {}
    for other in by_name.values():
        own = other is template
        for i, rule in enumerate(other.relations.exclusive_with):
            name = _resolve(rule.template, by_name, by_need, file_of[other.name],
                            f"relations.exclusive_with.{i}")
            if own:
                exclusive[(name, rule.scope)] = None
            elif name == template.name:
                exclusive[(other.name, rule.scope)] = None
        for i, raw in enumerate(other.relations.concurrent_with):
            name = _resolve(raw, by_name, by_need, file_of[other.name],
                            f"relations.concurrent_with.{i}")
            if own:
                concurrent[name] = None
            elif name == template.name:
                concurrent[other.name] = None
    for i, raw in enumerate(template.relations.concurrent_with):
        name = _resolve(raw, by_name, by_need, file, f"relations.concurrent_with.{i}")
        if any(excluded == name for excluded, _ in exclusive):
            raise TemplateError(
                f"{file}: relations.concurrent_with.{i}: {name} is excluded from "
                f"{template.name} (relations.exclusive_with, here or in {file_of[name]})")
    depends = [Dependency(template=_resolve(r.template, by_name, by_need, file,
                                            f"depends_on.{i}"),
                          scope=r.scope, on_failure=r.on_failure)
               for i, r in enumerate(template.depends_on)]
    return TaskRelations(
        template=template.name, concurrency=template.concurrency,
        exclusive_with=[ExclusiveWith(template=n, scope=sc) for n, sc in exclusive],
        concurrent_with=list(concurrent), depends_on=depends)


def _resolve(name: str, by_name: Mapping[str, Template],
             by_need: Mapping[NeedKind, Template], file: str, field: str) -> str:
    """A relation names a template, or a need kind standing for the template serving it."""
    if name in by_name:
        return name
    for need, template in by_need.items():
        if need == name:
            return template.name
    raise TemplateError(f"{file}: {field}: no template or need kind named {name!r}")


# ---------------------------------------------------------------- planning


def plan(template: Template, need: OpsNeed, now: datetime, source: str,
         dry_run: bool = False) -> OpsTask:
    """The task a template makes for a need (deterministic: the same need, the same task).

    A need raised as a dry run makes a dry-run task whatever `dry_run` says: it was raised to
    be seen, not acted on.
    """
    if need.kind != template.need:
        raise PlanError(f"template {template.label} serves {template.need}, not {need.kind}")
    need_values: dict[str, Scalar] = {
        "target": need.target, "cluster": need.cluster_id, "pool": need.pool,
    }
    values = {**template.parameters, **need_values}
    task_id = uuid5(ids.TEMPLATER_TASKS, f"task:{need.event_id}:{template.name}:{template.version}")
    steps: list[Step] = []
    for i, s in enumerate(template.steps):
        try:
            action = _STEP_ACTION.validate_python(_action_input(s, values))
            count = (s.execution_count if s.execution_count is not None
                     else step_execution_count(action))
            steps.append(Step(
                index=i, name=s.name, action=action, guard=s.guard, timeout_s=s.timeout_s,
                max_attempts=s.max_attempts or template.retry.max_attempts,
                execution_count=count,
            ))
        except ValidationError as err:
            raise PlanError(f"template {template.label}, step {s.name}: the need's values "
                            f"do not make a valid action: {err}") from err
    try:
        return OpsTask(
            event_id=uuid5(ids.TEMPLATER_TASKS, f"event:{task_id}"),
            source=source,
            occurred_at=now,
            cluster_id=need.cluster_id,
            subject=str(task_id),
            correlation_id=str(need.event_id),
            task_id=task_id,
            need_id=need.event_id,
            need_kind=need.kind,
            template=template.label,
            action_type=None,
            pool=need.pool,
            target=need.target,
            breaker_scope=template.breaker_scope,
            priority=template.priority,
            mutex_keys=lock_keys(template, need_values),
            dry_run=dry_run or need.dry_run,
            steps=steps,
            execution_count=task_execution_count(template, steps),
            relations=template.task_relations,
            evidence=list(need.evidence),
            ranges=need.ranges,
        )
    except ValidationError as err:
        raise PlanError(f"template {template.label}: the need's values do not make a valid "
                        f"task: {err}") from err


def lock_keys(template: Template, need_values: Mapping[str, Scalar]) -> list[str]:
    """The template's own locks (no repeats). Its concurrency and relations are not locks:
    they ride on the task (`OpsTask.relations`) and the scheduler admits by them."""
    return list(dict.fromkeys(render_text(m, need_values) for m in template.mutex))


def task_execution_count(template: Template, steps: Iterable[Step]) -> int | None:
    """The template's declared count, else the sum of its steps' (None if one is only known
    at run time)."""
    if template.execution_count is not None:
        return template.execution_count
    counts = [step.execution_count for step in steps]
    return None if None in counts else sum(c for c in counts if c is not None)
