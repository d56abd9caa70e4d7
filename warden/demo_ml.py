"""The ML half of `warden demo`: digits tasks flow through the API for the whole demo, a share
table every 10 s says where they ran (model@node) and how that went, and one model turns flaky
on one node for a while, so the tables show the router moving traffic away from it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import typer

from agent import fleet
from agent.faults import ModelFault
from services.api.client import ApiClient, ApiError

TASK_TYPE = "digits"
RATE_PER_S = 3.0
DEADLINE_S = 10.0
TABLE_EVERY_S = 10.0
WINDOW_S = 30.0
FLAKY_MODEL = "digits-mlp@1"  # when no model ran on a spare node yet
FLAKY_RATE = 0.5
FLAKY_AFTER_S = 8.0  # after the first ops fault, between it and the hot node
FLAKY_FOR_S = 45.0  # cleared before the ops script's last step
FINAL = ("succeeded", "failed")


def held_out_digits() -> list[list[float]]:
    """Every held-out digit of the shipped data set, as a digits task's input (0..16)."""
    from agent.ml.data import PIXEL_MAX, digits, split

    _, _, x_test, _ = split(*digits())
    return [[float(round(v * PIXEL_MAX)) for v in row] for row in x_test]


def attempts_by_arm(task: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """(model@version, node, succeeded) of each ended attempt of a finished task that ran on a
    node. A list row (no `attempt_list`) stands for its latest attempt only."""
    if task.get("state") not in FINAL:
        return []
    attempts = task.get("attempt_list")
    if attempts is None:
        attempts = [{"model": task.get("model"), "version": task.get("version"),
                     "node_id": task.get("node_id"), "outcome": task["state"]}]
    return [(f"{a['model']}@{a['version']}", a["node_id"], a["outcome"] == "succeeded")
            for a in attempts
            if a.get("model") and a.get("node_id") and a.get("outcome") in FINAL]


def _rate(ok: int, n: int) -> str:
    # Rounded down: 100% only when nothing failed.
    return f"{100 * ok // n}%" if n else "-"


def share_table(tasks: Sequence[Mapping[str, Any]], models: Iterable[str] = (),
                nodes: Iterable[str] = (), window_s: float = WINDOW_S) -> str:
    """A summary line, then one row per model and one column per node: how many tasks were
    tried on that model@node (a retried task counts wherever it was tried) and their success
    rate. `models` and `nodes` are shown even when nothing ran there."""
    cells: dict[tuple[str, str], tuple[int, int]] = {}
    for task in tasks:
        for arm, node, ok in attempts_by_arm(task):
            n, good = cells.get((arm, node), (0, 0))
            cells[arm, node] = (n + 1, good + ok)
    done = [t for t in tasks if t.get("state") in FINAL]
    succeeded = sum(t["state"] == "succeeded" for t in done)
    retried = sum(int(t.get("attempts") or 0) > 1 for t in done)
    lines = [f"ML tasks, last {window_s:g} s: {len(done)} finished, "
             f"{_rate(succeeded, len(done))} succeeded, {retried} after a retry; "
             f"tried on each model@node:"]
    row_names = sorted(set(models) | {arm for arm, _ in cells})
    columns = sorted(set(nodes) | {node for _, node in cells})
    first = max([len("model"), *map(len, row_names)])
    width = max([len("100 100%"), *map(len, columns)])
    lines.append("  " + "model".ljust(first) + "".join(f"  {c:>{width}}" for c in columns))
    for arm in row_names:
        row = "".join(f"  {n:>{width - 5}} {_rate(ok, n):>4}"
                      for n, ok in (cells.get((arm, c), (0, 0)) for c in columns))
        lines.append("  " + arm.ljust(first) + row)
    return "\n".join(lines)


def recent_tasks(client: ApiClient, window_s: float = WINDOW_S) -> list[dict[str, Any]]:
    """The digits tasks active in the last `window_s`, from the API; a retried one in full
    (with its attempts), so each of its tries counts where it ran."""
    since = (datetime.now(UTC) - timedelta(seconds=window_s)).isoformat(timespec="seconds")
    rows: list[dict[str, Any]] = client.ml_tasks(task_type=TASK_TYPE, since=since,
                                                 limit=500)["items"]
    return [client.ml_task(UUID(r["task_id"])) if r["attempts"] > 1 and r["state"] in FINAL
            else r for r in rows]


@dataclass
class Traffic:
    """What the submitter saw since the last table."""

    refused: int = 0
    last_error: str = ""


async def submit_forever(client: ApiClient, inputs: Sequence[list[float]], traffic: Traffic,
                         flowing: asyncio.Event, rate: float = RATE_PER_S) -> None:
    """Submit digits tasks at `rate` per second, as `warden submit` does (POST /api/v1/ml/tasks);
    `flowing` is set by the first accepted one. A refusal is counted, never fatal."""
    due = time.monotonic()
    for i in itertools.count():
        try:
            await asyncio.to_thread(client.submit_ml, TASK_TYPE, inputs[i % len(inputs)],
                                    DEADLINE_S, 5, False)
            flowing.set()
        except ApiError as err:
            traffic.refused += flowing.is_set()  # before that, the API may still be starting
            traffic.last_error = str(err)
        due = max(due + 1.0 / rate, time.monotonic() - 1.0)  # late: no burst to catch up
        await asyncio.sleep(max(0.0, due - time.monotonic()))


async def report_forever(client: ApiClient, traffic: Traffic, models: Iterable[str],
                         nodes: Iterable[str]) -> None:
    """Every TABLE_EVERY_S, the share table of the last WINDOW_S."""
    while True:
        await asyncio.sleep(TABLE_EVERY_S)
        try:
            tasks = await asyncio.to_thread(recent_tasks, client)
        except ApiError as err:
            typer.echo(f"(no ML share table: {err})")
            continue
        text = share_table(tasks, models, nodes)
        if traffic.refused:
            text += f"\n  {traffic.refused} submissions refused, last: {traffic.last_error}"
        traffic.refused = 0
        typer.echo(text)


def busiest(tasks: Sequence[Mapping[str, Any]], nodes: Iterable[str]) -> tuple[str, str] | None:
    """The (model@version, node) that was tried most often among `nodes`, if any."""
    among = set(nodes)
    tried = Counter((arm, node) for task in tasks for arm, node, _ in attempts_by_arm(task)
                    if node in among)
    return tried.most_common(1)[0][0] if tried else None


async def run(make_client: Callable[[], ApiClient], state: Path, models: Sequence[str],
              nodes: Sequence[str], spare: Sequence[str], fault_after: float,
              step: Callable[[str], None]) -> None:
    """The ML script, alongside the ops one (times from the demo's start): tasks flow all
    along; FLAKY_AFTER_S after the first ops fault, the busiest model@node on a `spare` node
    (FLAKY_MODEL on the first if none ran yet) fails FLAKY_RATE of its tasks for FLAKY_FOR_S."""
    flaky_at = time.monotonic() + fault_after + FLAKY_AFTER_S
    inputs = await asyncio.to_thread(held_out_digits)
    traffic, flowing = Traffic(), asyncio.Event()
    with make_client() as submitter, make_client() as reader:
        async with asyncio.TaskGroup() as group:  # cancelled with the demo
            group.create_task(submit_forever(submitter, inputs, traffic, flowing))
            while not flowing.is_set():
                try:
                    await asyncio.wait_for(flowing.wait(), 30.0)
                except TimeoutError:
                    typer.echo(f"(no ML task accepted yet: {traffic.last_error})")
            step(f"ML tasks flowing: {RATE_PER_S:g} digits tasks/s through the API; every "
                 f"{TABLE_EVERY_S:g} s, the share by model@node")
            group.create_task(report_forever(reader, traffic, models, nodes))
            await asyncio.sleep(max(0.0, flaky_at - time.monotonic()))
            flaky = None
            with contextlib.suppress(ApiError):
                flaky = busiest(await asyncio.to_thread(recent_tasks, reader, TABLE_EVERY_S),
                                spare)
            model, node = flaky or (FLAKY_MODEL, spare[0])
            step(f"{model} turns flaky on {node}: {FLAKY_RATE:.0%} of its answers are NaN "
                 "(a model fault); the router moves its traffic away")
            fault = ModelFault(model=model, failure_rate=FLAKY_RATE)
            fleet.inject_fault(state, node, model_faults=[fault.model_dump()])
            await asyncio.sleep(FLAKY_FOR_S)
            step(f"{model} on {node} repaired: its fault clears")
            fleet.inject_fault(state, node, model_faults=[])
