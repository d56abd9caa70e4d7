"""`warden submit` and `warden ml`: ML tasks and the models that run them (through the API)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
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
    SinceOption,
    TimeoutOption,
    fail,
    identifier,
    optional_identifier,
    or_dash,
    print_json,
    table,
    when,
)

app = typer.Typer(help="ML tasks and the models that run them (through the API).",
                  no_args_is_help=True)


FINAL_ML_STATES = frozenset({"succeeded", "failed"})


def held_out_digit(index: int) -> list[float]:
    """The index-th held-out digit of the data set, as a digits task's input (0..16)."""
    from agent.ml.data import PIXEL_MAX, digits, split

    _, _, x_test, _ = split(*digits())
    return [float(round(v * PIXEL_MAX)) for v in x_test[index % len(x_test)]]


def parse_input(text: str) -> list[float]:
    """Numbers separated by commas or blanks."""
    try:
        return [float(part) for part in text.replace(",", " ").split()]
    except ValueError as err:
        raise typer.BadParameter("numbers separated by commas or blanks",
                                 param_hint="--input") from err


def attempt_line(attempt: Mapping[str, Any]) -> str:
    """One attempt: where it ran, the decision, how it ended."""
    where = (f"{attempt.get('model')}:{attempt.get('version')} on {attempt.get('node_id')}"
             if attempt.get("node_id") else f"nothing chosen ({attempt.get('status')})")
    if attempt.get("outcome") == "succeeded":
        end = f"-> {attempt.get('prediction')} ({or_dash(attempt.get('latency_ms'))} ms)"
    elif attempt.get("outcome") == "failed":
        end = f"-> failed: {attempt.get('cause')} (against {attempt.get('attributed_to')})"
    else:
        end = "-> in flight"
    return f"  attempt {attempt['attempt']}: {where} [{attempt.get('status')}] {end}"


def describe_ml_task(task: Mapping[str, Any], candidates: bool = False) -> str:
    """`warden ml show`: the task, its attempts and (with --candidates) every decision."""
    lines = [
        f"task      {task['task_id']}  ({task.get('task_type')}, priority "
        f"{or_dash(task.get('priority'))}{', critical' if task.get('critical') else ''}, by "
        f"{or_dash(task.get('submitted_by'))})",
        f"state     {task['state']}  {or_dash(task.get('reason'))}",
        f"answer    {or_dash(task.get('prediction'))} (confidence "
        f"{or_dash(task.get('confidence'))}) by {or_dash(task.get('model'))}:"
        f"{or_dash(task.get('version'))} on {or_dash(task.get('node_id'))}, "
        f"{or_dash(task.get('latency_ms'))} ms",
        f"times     created {when(task.get('created_at'))}, deadline "
        f"{when(task.get('deadline'))}, finished {when(task.get('finished_at'))}",
    ]
    for attempt in task.get("attempt_list") or []:
        lines.append(attempt_line(attempt))
        if attempt.get("decision_reason"):
            lines.append(f"    decision: {attempt['decision_reason']}")
        if candidates:
            lines.append(table(
                ["    ARM", "STATE", "ELIGIBLE", "MEAN", "N", "INFLIGHT", "SCORE", "REASON"],
                [[f"    {c['arm']}", c["state"], "yes" if c["eligible"] else "no",
                  f"{c['mean']:.3f}", f"{c['n_eff']:.1f}", f"{c['inflight']}/{c['limit']}",
                  f"{c['score']:.3f}" if c.get("score") is not None else "-", c["reason"]]
                 for c in attempt.get("candidates") or []], max_width=70))
    return "\n".join(lines)


def ml_tasks_table(rows: Sequence[Mapping[str, Any]]) -> str:
    return table(["TASK", "STATE", "TYPE", "MODEL", "NODE", "TRIES", "ANSWER", "CAUSE",
                  "CREATED"],
                 [[str(r["task_id"]), r["state"], or_dash(r.get("task_type")),
                   f"{r['model']}:{r['version']}" if r.get("model") else "-",
                   or_dash(r.get("node_id")), str(r.get("attempts", 0)),
                   or_dash(r.get("prediction")), or_dash(r.get("cause")),
                   when(r.get("created_at"))] for r in rows])


def submit(
    task_type: Annotated[str, typer.Option("--type", help="The task type (e.g. digits).",
                                           callback=identifier)] = "digits",
    digit: Annotated[int | None, typer.Option(
        min=0, help="Send the N-th held-out digit of the data set (a digits task).")] = None,
    values: Annotated[str | None, typer.Option(
        "--input", help="The input: numbers separated by commas or blanks.")] = None,
    deadline: Annotated[float, typer.Option(min=0.001, max=3_600.0,
                                            help="Seconds it must be done in.")] = 10.0,
    priority: Annotated[int, typer.Option(min=0, max=9, help="0 is the most urgent.")] = 5,
    critical: Annotated[bool, typer.Option(
        help="Choose the model by a pessimistic bound, not a sample.")] = False,
    wait: Annotated[bool, typer.Option(
        "--wait", help="Follow the task until it succeeds or fails.")] = False,
    timeout: TimeoutOption = 60.0,
    as_json: JsonOption = False,
) -> None:
    """Submit an ML task (operator); the router chooses the model, version and node."""
    if (digit is None) == (values is None):
        raise typer.BadParameter("give exactly one of --digit and --input")
    payload = held_out_digit(digit) if digit is not None else parse_input(values or "")
    try:
        with common.api_client() as client:
            accepted = client.submit_ml(task_type, payload, deadline, priority, critical)
            task_id = UUID(accepted["task_id"])
            if not wait:
                if as_json:
                    print_json(accepted)
                else:
                    typer.echo(f"submitted ML task {task_id} (deadline "
                               f"{when(accepted['deadline'])})")
                return
            task = follow_ml(client, task_id, timeout, quiet=as_json)
    except ApiError as err:
        raise fail(err) from err
    if as_json:
        print_json(task)
    if task["state"] != "succeeded":
        raise typer.Exit(common.EXIT_FAILED)


def follow_ml(client: ApiClient, task_id: UUID, timeout_s: float, poll_s: float = 0.25,
              quiet: bool = False) -> Mapping[str, Any]:
    """Print each attempt as it ends, until the task is final (EXIT_WAIT_TIMEOUT on timeout)."""
    deadline = time.monotonic() + timeout_s
    shown: set[tuple[int, str | None]] = set()
    if not quiet:
        typer.echo(f"submitted ML task {task_id}")
    while True:
        try:
            task = client.ml_task(task_id)
        except ApiError as err:
            if err.status != 404:  # not recorded yet
                raise
            task = {"state": "submitted", "attempt_list": []}
        for attempt in task.get("attempt_list") or []:
            key = (attempt["attempt"], attempt.get("outcome"))
            if key not in shown and (attempt.get("outcome") or attempt.get("node_id")):
                shown.add(key)
                if not quiet:
                    typer.echo(attempt_line(attempt))
        if task["state"] in FINAL_ML_STATES:
            if not quiet:
                typer.echo(f"{task['state']}: {or_dash(task.get('reason'))}")
            return task
        if time.monotonic() >= deadline:
            raise common.wait_timed_out(task["state"], timeout_s)
        time.sleep(poll_s)


@app.command("list")
def ml_list(
    state: Annotated[str | None, typer.Option(
        help="submitted, running, succeeded, failed")] = None,
    task_type: Annotated[str | None, typer.Option("--type",
                                                  callback=optional_identifier)] = None,
    node: Annotated[str | None, typer.Option(help="Any attempt ran there.",
                                             callback=optional_identifier)] = None,
    model: Annotated[str | None, typer.Option(help="Any attempt used it.",
                                              callback=optional_identifier)] = None,
    cluster: ClusterOption = None,
    since: SinceOption = None,
    limit: LimitOption = 50,
    offset: OffsetOption = 0,
    as_json: JsonOption = False,
) -> None:
    """ML tasks, newest first, filtered."""
    page = common.from_api(lambda client: client.ml_tasks(
        state=state, task_type=task_type, node=node, model=model, cluster=cluster, since=since,
        limit=limit, offset=offset))
    if as_json:
        print_json(page)
    elif not page["items"]:
        typer.echo("no ML task matches")
    else:
        typer.echo(ml_tasks_table(page["items"]))


@app.command("show")
def ml_show(task_id: UUID, candidates: Annotated[bool, typer.Option(
        help="Also every candidate of every decision: statistics, eligibility, why.")] = False,
            as_json: JsonOption = False) -> None:
    """An ML task: its answer, its attempts and the decisions behind them."""
    task = common.from_api(lambda client: client.ml_task(task_id))
    if as_json:
        print_json(task)
    else:
        typer.echo(describe_ml_task(task, candidates))


@app.command("models")
def ml_models(
    cluster: ClusterOption = None,
    task_type: Annotated[str | None, typer.Option("--type",
                                                  callback=optional_identifier)] = None,
    as_json: JsonOption = False,
) -> None:
    """Which model versions each node serves, and how each is doing (live)."""
    view = common.from_api(lambda client: client.ml_models(cluster, task_type))
    if as_json:
        print_json(view)
        return
    if not view["arms"]:
        typer.echo("no node reports a served model")
        return
    typer.echo(table(
        ["NODE", "TYPE", "MODEL", "FAMILY", "STATE", "READY", "QUARANTINE", "MEAN", "N",
         "INFLIGHT", "LATENCY MS"],
        [[a["node_id"], a["task_type"], f"{a['model']}:{a['version']}", a["family"],
          a["model_state"], "yes" if a["ready"] else "no",
          a["quarantine"] + (f" until {when(a['quarantined_until'])[11:]}"
                             if a.get("quarantined_until") else ""),
          f"{a['mean']:.3f}", f"{a['n_eff']:.1f}", str(a["inflight"]),
          or_dash(a.get("latency_ms"))] for a in view["arms"]]))
