"""`warden tasks`: list, show and intervene in ops tasks (through the API)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any
from uuid import UUID

import typer

from services.api.client import ApiClient, ApiError
from warden.cli import common
from warden.cli.common import (
    ClusterOption,
    JsonOption,
    LimitOption,
    OffsetOption,
    ReasonOption,
    SinceOption,
    TimeoutOption,
    WaitOption,
    fail,
    optional_identifier,
    or_dash,
    print_json,
    print_page,
    table,
    when,
)

app = typer.Typer(help="Ops tasks: list, show and intervene (through the API).",
                  no_args_is_help=True)


FINAL_TASK_STATES = frozenset({"succeeded", "failed", "terminated"})


def step_of(task: Mapping[str, Any]) -> str:
    """`current/total` steps (1-based), as far as they are known."""
    total, current = task.get("step_count"), task.get("current_step")
    if total is None:
        return "-"
    return f"{(current + 1) if current is not None else 0}/{total}"


def tasks_table(rows: Sequence[Mapping[str, Any]]) -> str:
    return table(["TASK", "STATE", "KIND", "TARGET", "STEP", "TEMPLATE", "UPDATED", "REASON"],
                 [[str(r["task_id"]), r["state"], or_dash(r.get("kind") or r.get("need_kind")),
                   or_dash(r.get("target")), step_of(r), or_dash(r.get("template")),
                   when(r.get("updated_at")), or_dash(r.get("reason"))] for r in rows])


def resources(outputs: Mapping[str, Any]) -> str:
    """`initial -> target` of a capacity change a step recorded (empty if none)."""
    if "initial_nodes" not in outputs or "target_nodes" not in outputs:
        return ""

    def side(prefix: str) -> str:
        util = outputs.get(f"{prefix}_util_pct")
        shown = f" at {util:g}%" if isinstance(util, int | float) else ""
        return f"{outputs[f'{prefix}_nodes']} nodes{shown}"

    return f"{side('initial')} -> {side('target')}"


def describe_task(task: Mapping[str, Any]) -> str:
    """`warden tasks show`: the task, its evidence, steps, children and transitions."""
    parent = task.get("parent_task_id")
    lines = [
        f"task      {task['task_id']}" + (f"  (child of {parent})" if parent else ""),
        f"state     {task['state']}  {or_dash(task.get('reason'))}",
        f"kind      {or_dash(task.get('kind'))} (need {or_dash(task.get('need_kind'))}), template "
        f"{or_dash(task.get('template'))}, priority {or_dash(task.get('priority'))}"
        + ("  DRY RUN" if task.get("dry_run") else ""),
        f"where     cluster {task['cluster_id']}, pool {or_dash(task.get('pool'))}, target "
        f"{or_dash(task.get('target'))}",
        f"times     created {when(task.get('created_at'))}, updated "
        f"{when(task.get('updated_at'))}, finished {when(task.get('finished_at'))}",
        f"executes  {ops(task.get('execution_count'))}",
    ]
    if task.get("relations"):
        lines.append(f"relations {relations_text(task['relations'])}")
    evidence = task.get("evidence") or []
    if evidence:
        lines.append("evidence")
        for ev in evidence:
            lines.append(f"  {ev.get('metric')}={ev.get('value')} outside "
                         f"[{ev.get('range_low')}, {ev.get('range_high')}] "
                         f"{ev.get('detail', '')}".rstrip())
    steps = task.get("steps") or []
    counts = task.get("step_execution_counts") or []
    if steps:
        lines += ["", table(
            ["#", "STEP", "ACTION", "OPS", "GUARD", "STATE", "TRIES", "COMMAND", "RESULT"],
            [[str(s["index"]), or_dash(s.get("name")), or_dash(s.get("action")),
              ops(counts[s["index"]], short=True) if s["index"] < len(counts) else "-",
              or_dash(s.get("guard")), s["state"], str(s.get("attempts", 0)),
              str(s["command_id"])[:8] if s.get("command_id") else "-",
              resources(s.get("outputs") or {}) or or_dash(s.get("reason"))]
             for s in steps], max_width=70)]
    children = task.get("children") or []
    if children:
        lines += ["", "children", tasks_table(children)]
    transitions = task.get("transitions") or []
    if transitions:
        lines += ["", table(["AT", "STATE", "STEP", "ACTOR", "REASON"],
                            [[when(t.get("occurred_at")), t["state"], transition_step(t),
                              t["actor"], or_dash(t.get("reason"))] for t in transitions],
                            max_width=80)]
    return "\n".join(lines)


def ops(count: Any, short: bool = False) -> str:
    """An execution count: how many ops (nodes, jobs); None is computed at run time."""
    if count is None:
        return "run time" if short else "computed at run time"
    return str(count) if short else f"{count} op(s)"


def relations_text(relations: Mapping[str, Any]) -> str:
    """A template's concurrency and relations on one line."""
    parts = [f"concurrency {relations.get('concurrency')}"]
    exclusive = [f"{r['template']} ({r['scope']})" for r in relations.get("exclusive_with", [])]
    depends = [f"{r['template']} ({r['scope']}, on failure {r['on_failure']})"
               for r in relations.get("depends_on", [])]
    for name, items in (("exclusive_with", exclusive), ("depends_on", depends),
                        ("concurrent_with", relations.get("concurrent_with", []))):
        if items:
            parts.append(f"{name} {', '.join(items)}")
    return "; ".join(parts)


def transition_step(t: Mapping[str, Any]) -> str:
    if t.get("step_index") is None:
        return "-"
    return f"{t['step_index']} {t.get('step_state') or ''}".rstrip()


def transition_line(t: Mapping[str, Any]) -> str:
    """One line per transition while following a task."""
    step = f" step {transition_step(t)}" if t.get("step_index") is not None else ""
    return f"{when(t.get('occurred_at'))[11:]}  {t['state']}{step}  {t['actor']}: " \
           f"{or_dash(t.get('reason'))}"


def follow(client: ApiClient, task_id: UUID, done: Callable[[Mapping[str, Any]], bool],
           timeout_s: float, poll_s: float = 1.0, seen: int | None = None) -> Mapping[str, Any]:
    """Print the task's transitions as they are recorded until `done(task)` or timeout."""
    deadline = time.monotonic() + timeout_s
    task = client.task(task_id)
    shown = len(task.get("transitions") or []) if seen is None else seen
    while True:
        transitions = task.get("transitions") or []
        for t in transitions[shown:]:
            typer.echo(transition_line(t))
        shown = len(transitions)
        if done(task):
            return task
        if time.monotonic() >= deadline:
            raise common.wait_timed_out(task["state"], timeout_s)
        time.sleep(poll_s)
        task = client.task(task_id)


def _refusal(action: str, since: int) -> Callable[[Mapping[str, Any]], bool]:
    """True once the executor recorded a refusal of `action` after transition `since`."""
    def refused(task: Mapping[str, Any]) -> bool:
        return any((t.get("outputs") or {}).get("refused")
                   and (t.get("outputs") or {}).get("control") == action
                   for t in (task.get("transitions") or [])[since:])
    return refused


@app.command("list")
def tasks_list(
    node: Annotated[str | None, typer.Option(help="Tasks on this node (target or a step's).",
                                             callback=optional_identifier)] = None,
    cluster: ClusterOption = None,
    state: Annotated[str | None, typer.Option(help="created, queued, dispatched, running, "
                                              "paused, succeeded, failed, terminated")] = None,
    kind: Annotated[str | None, typer.Option(help="Need kind or task kind.",
                                             callback=optional_identifier)] = None,
    parent: Annotated[UUID | None, typer.Option(help="Children of this task.")] = None,
    since: SinceOption = None,
    until: Annotated[str | None, typer.Option(help="Created before (ISO time, UTC).")] = None,
    top_level: Annotated[bool, typer.Option(help="Only tasks without a parent.")] = False,
    limit: LimitOption = 50,
    offset: OffsetOption = 0,
    as_json: JsonOption = False,
) -> None:
    """Tasks, newest first, filtered."""
    page = common.from_api(lambda client: client.tasks(
        node=node, cluster=cluster, state=state, kind=kind,
        parent=str(parent) if parent else None, since=since, until=until,
        top_level=top_level or None, limit=limit, offset=offset))
    print_page(page, as_json, offset, tasks_table, "task")


@app.command("show")
def tasks_show(task_id: UUID, as_json: JsonOption = False, wait: WaitOption = False,
               timeout: TimeoutOption = 600.0) -> None:
    """A task with its evidence, steps, children and transitions."""
    try:
        with common.api_client() as client:
            task = client.task(task_id)
            if as_json:
                print_json(task)
            else:
                typer.echo(describe_task(task))
            if wait and task["state"] not in FINAL_TASK_STATES:
                follow(client, task_id, lambda t: t["state"] in FINAL_TASK_STATES, timeout)
    except ApiError as err:
        raise fail(err) from err


def _control(task_id: UUID, action: str, reason: str, step: int | None, wait: bool,
             timeout: float, as_json: bool) -> None:
    try:
        with common.api_client() as client:
            before = len(client.task(task_id).get("transitions") or []) if wait else 0
            accepted = client.control(task_id, action, reason, step)
            if as_json:
                print_json(accepted)
            else:
                typer.echo(f"{action} of task {task_id} accepted (control "
                           f"{accepted['control_event_id']}): expect "
                           f"{accepted['expected_state']}; {accepted['note']}")
            if not wait:
                return
            expected = accepted["expected_state"]
            refused = _refusal(action, before)
            task = follow(client, task_id,
                          lambda t: t["state"] == expected or refused(t)
                          or t["state"] in FINAL_TASK_STATES, timeout, seen=before)
    except ApiError as err:
        raise fail(err) from err
    if refused(task) or task["state"] != expected:
        typer.echo(f"the task is {task['state']}: the {action} did not take effect", err=True)
        raise typer.Exit(common.EXIT_FAILED)


def _control_command(action: str, doc: str) -> None:
    def command(task_id: UUID, reason: ReasonOption, wait: WaitOption = False,
                timeout: TimeoutOption = 300.0, as_json: JsonOption = False) -> None:
        _control(task_id, action, reason, None, wait, timeout, as_json)

    command.__doc__ = doc
    app.command(action)(command)


_control_command("pause", "Pause a task at its next step boundary (operator).")
_control_command("resume", "Resume a paused task (operator).")
_control_command("retry", "Retry a failed task from its failed step (operator).")
_control_command("terminate", "Terminate a task; a running command is cancelled (operator).")
_control_command("restart", "Run a failed or terminated task again from its first step, "
                            "under a new epoch (operator).")


@app.command("jump")
def tasks_jump(task_id: UUID,
               step: Annotated[int, typer.Option(min=0, max=63, help="The step (0-based).")],
               reason: ReasonOption, wait: WaitOption = False, timeout: TimeoutOption = 300.0,
               as_json: JsonOption = False) -> None:
    """Move a paused or failed task to a step, paused there; resume runs it (admin)."""
    _control(task_id, "jump", reason, step, wait, timeout, as_json)
