"""One trace from a node's report to the last step of the task it caused, in a real Jaeger
(docs/tracing.md), on the real broker, Redis, services and agents.

A fatal XID on one node: its agent's report, the collector's span for it (out of a batch),
the analyzer's for its sample (out of a batch of samples) and for the offline need it
raises, the templater's plan, the scheduler's dispatch (from its Redis queue, by a loop),
the executor's task, every step of the plan (skipped ones too), each command, the agent's
execution of it and its answer, and the task's end must all be spans of ONE trace: the
agent's report is its root. Jaeger is started through deploy/local/jaeger.sh; a Jaeger that
cannot start fails the test, it never skips.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent import fleet
from schemas.events.v1 import OpsTask
from schemas.topics import Topic
from tests.chaos.harness import CLUSTER, FLOW, TARGET, all_up, stack_with_fleet
from tests.integration.harness import (
    SMALL_POOL_SAFETY,
    is_success_of,
    name,
    stack_env,
    tap,
    task_events_for,
    until,
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "local" / "jaeger.sh"
# The script's defaults (JAEGER_OTLP_GRPC_PORT, JAEGER_UI_PORT steer both the same way).
OTLP_GRPC_PORT = os.getenv("JAEGER_OTLP_GRPC_PORT", "14317")
UI_PORT = os.getenv("JAEGER_UI_PORT", "16686")


@pytest.fixture(scope="module")
def jaeger() -> Iterator[str]:
    """Jaeger's query API, started through the project's script if it is not running (and
    then stopped after); one that does not start fails the test."""
    def run(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(SCRIPT), command], capture_output=True, text=True,
                              check=False, timeout=1800)

    started = run("status").returncode != 0
    if started and (answer := run("start")).returncode != 0:
        pytest.fail(f"Jaeger is needed and `{SCRIPT} start` failed: "
                    f"{answer.stdout}{answer.stderr}", pytrace=False)
    try:
        yield f"http://127.0.0.1:{UI_PORT}"
    finally:
        if started:
            run("stop")


@dataclass(frozen=True)
class SpanSeen:
    """One span of a trace as Jaeger's query API returns it."""

    trace_id: str
    span_id: str
    service: str
    operation: str
    tags: dict[str, Any]
    parents: tuple[str, ...]  # the span ids it is a child of (none: the root)
    process: dict[str, Any]  # its process's resource attributes


def spans_of(trace: dict[str, Any]) -> list[SpanSeen]:
    processes = trace["processes"]
    return [SpanSeen(
        trace_id=span["traceID"], span_id=span["spanID"],
        service=processes[span["processID"]]["serviceName"],
        operation=span["operationName"],
        tags={tag["key"]: tag["value"] for tag in span.get("tags") or ()},
        parents=tuple(ref["spanID"] for ref in span.get("references") or ()
                      if ref["refType"] == "CHILD_OF"),
        process={tag["key"]: tag["value"]
                 for tag in processes[span["processID"]].get("tags") or ()},
    ) for span in trace["spans"]]


async def traces(base: str, service: str, tags: dict[str, str]) -> list[dict[str, Any]]:
    """The traces holding a span of `service` with `tags` (`GET /api/traces`)."""
    async with httpx.AsyncClient(timeout=10.0) as client:
        response = await client.get(f"{base}/api/traces", params={
            "service": service, "tags": json.dumps(tags), "lookback": "1h", "limit": "50"})
    if response.status_code == 404:  # a service Jaeger has no span of yet
        return []
    response.raise_for_status()
    found: list[dict[str, Any]] = response.json()["data"] or []
    return found


async def whole_trace(base: str, trace_id: str) -> list[SpanSeen]:
    async with httpx.AsyncClient(timeout=10.0) as client:
        response = await client.get(f"{base}/api/traces/{trace_id}")
    response.raise_for_status()
    return [span for trace in response.json()["data"] for span in spans_of(trace)]


def offline_task(events: list[Any]) -> OpsTask:
    tasks = [e.task for e in events if e.task is not None and e.task.need_kind == "offline"]
    assert tasks, "no offline task among the task events"
    task: OpsTask = tasks[0]
    return task


def missing_from(spans: list[SpanSeen], task: OpsTask) -> list[str]:
    """What the trace should hold and does not (yet): [] once it holds all of it."""
    task_id, node = str(task.task_id), TARGET

    def has(service: str, operation: str, **tags: Any) -> bool:
        return any(s.service == service and s.operation == operation
                   and all(s.tags.get(k) == v for k, v in tags.items()) for s in spans)

    wanted = {
        "the agent's report": has("agent", "agent.report", **{"node.id": node,
                                                                "cluster.id": CLUSTER}),
        "the collector's report": has("collector", "collector.report", **{"node.id": node}),
        "the analyzer's sample": has("analyzer", "analyzer.sample", **{"node.id": node}),
        "the analyzer's need": has("analyzer", "analyzer.need", **{
            "need.id": str(task.need_id), "need.kind": "offline", "node.id": node}),
        "the templater's plan": has("templater", "templater.plan", **{
            "need.id": str(task.need_id), "task.id": task_id}),
        "the scheduler's dispatch": has("scheduler", "scheduler.dispatch",
                                        **{"task.id": task_id}),
        "the executor's task": has("executor", "executor.task", **{"task.id": task_id}),
        "the task's end": has("executor", "executor.task.end", **{
            "task.id": task_id, "task.state": "succeeded"}),
    }
    for index, step in enumerate(task.steps):
        wanted[f"step {index} ({step.name})"] = has(
            "executor", "executor.step",
            **{"task.id": task_id, "step.index": index, "step.name": step.name,
               "cluster.id": CLUSTER})
    for action in ("drain_node", "offline_node"):
        wanted[f"the {action} command"] = has("executor", "executor.command", **{
            "task.id": task_id, "command.action": action, "node.id": node})
        wanted[f"the agent's {action}"] = has("agent", "agent.command", **{
            "task.id": task_id, "command.action": action, "node.id": node,
            "command.outcome": "succeeded"})
        wanted[f"the agent's answer to {action}"] = has("agent", "agent.result", **{
            "task.id": task_id, "command.action": action, "command.outcome": "succeeded"})
        wanted[f"the executor's receipt of the {action} answer"] = has(
            "executor", "executor.step.result",
            **{"task.id": task_id, "step.action": action, "step.outcome": "succeeded"})
    return [what for what, present in wanted.items() if not present]


@pytest.mark.timeout(600)  # the waits' own deadlines, not this, are what should fail
async def test_a_fault_is_one_trace_from_the_report_to_the_commands_answers(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path, jaeger: str
) -> None:
    env = stack_env(
        kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
        AGENT_JOBS="", ANALYZER_ENABLED_NEEDS='["offline"]', COLLECTOR_PROBE_PERIOD_S="3600",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{OTLP_GRPC_PORT}",
        # Spans leave every 0.1 s instead of every 5 s.
        OTEL_BSP_SCHEDULE_DELAY="100",
        # Which run a span came from, in a Jaeger other runs share.
        OTEL_RESOURCE_ATTRIBUTES=f"warden.namespace={namespace}",
        **SMALL_POOL_SAFETY)
    async with (stack_with_fleet(redis_url, namespace, tmp_path, env, FLOW),
                tap(kafka_bootstrap, name(Topic.OPS_NODE_STATE, namespace),
                    name(Topic.OPS_TASK_EVENTS, namespace)) as watch):
        await all_up(watch)
        fleet.inject_fault(tmp_path, TARGET, xid=[79])
        await watch.wait_for(is_success_of(watch, TARGET), 120, f"{TARGET} offline")
        task = offline_task(task_events_for(watch, TARGET))

        # Every span anywhere that names the task is in one trace, and that trace holds
        # the whole way from the report (spans reach Jaeger a moment after they end).
        found: dict[str, Any] = {"trace_ids": set(), "missing": ["(no trace yet)"]}

        async def one_whole_trace() -> bool:
            trace_ids = set()
            for service in ("templater", "scheduler", "executor", "agent"):
                for trace in await traces(jaeger, service, {"task.id": str(task.task_id)}):
                    trace_ids.add(trace["traceID"])
            found["trace_ids"] = trace_ids
            if len(trace_ids) != 1:
                return False
            spans = await whole_trace(jaeger, next(iter(trace_ids)))
            found["spans"] = spans
            found["missing"] = missing_from(spans, task)
            return not found["missing"]

        await until(one_whole_trace, 60, lambda: (
            f"one trace holding the task {task.task_id}: traces {sorted(found['trace_ids'])},"
            f" missing {found['missing']}"))

    spans: list[SpanSeen] = found["spans"]
    roots = [s for s in spans if not s.parents]
    assert [(r.service, r.operation) for r in roots] == [("agent", "agent.report")], roots
    assert roots[0].tags["node.id"] == TARGET
    assert roots[0].tags["report.faults"] >= 1
    # Every step's span is the task's and its need's, in its cluster; skipped ones too.
    steps = [s for s in spans if s.operation == "executor.step"]
    assert {s.tags["step.index"] for s in steps} == set(range(len(task.steps)))
    assert all(s.tags["cluster.id"] == CLUSTER and s.tags["need.id"] == str(task.need_id)
               for s in steps)
    assert {s.tags.get("step.state") for s in steps} >= {"started", "skipped"}
    # This run's processes sent every span of it.
    assert {s.process.get("warden.namespace") for s in spans} == {namespace}
