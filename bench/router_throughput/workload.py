"""The workload and its figures: the fleet and its reports, the submissions, the simulated
agents' answers, and the table (pure: no Redis, no broker)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

from bench.common import percentile
from common.signing import unb64url
from schemas.events.v1 import (
    Command,
    CommandPayload,
    CommandResult,
    InferenceOutput,
    MlTaskSubmitted,
    NodeReport,
    RunInference,
    ServedModel,
    now_utc,
)
from tests.contracts.examples import DIGIT, examples

CLUSTER = "bench"
TASK_TYPE = "digits"
# (model, version, family): 5 model versions on every node.
MODELS: tuple[tuple[str, str, str], ...] = (
    ("digits-logreg", "1", "logreg"), ("digits-logreg", "2", "logreg"),
    ("digits-mlp", "1", "mlp"), ("digits-mlp", "2", "mlp"), ("digits-knn", "1", "knn"))
# Reports that stay fresh for the whole run (freshness: three intervals).
REPORT_INTERVAL_S = 3_600.0


def node_names(nodes: int) -> list[str]:
    return [f"node-{i:03d}" for i in range(nodes)]


def served_models(models: Sequence[tuple[str, str, str]], limit: int) -> list[ServedModel]:
    return [ServedModel(task_type=TASK_TYPE, model=m, version=v, family=f, state="ready",
                        max_concurrency=limit) for m, v, f in models]


def node_reports(cluster: str, nodes: Sequence[str], models: Sequence[ServedModel],
                 at: datetime, seq: int = 1) -> list[NodeReport]:
    """One report per node, serving `models`, as an agent would send it."""
    template = examples()["node_report"]
    assert isinstance(template, NodeReport)
    return [template.model_copy(update={
        "event_id": uuid4(), "occurred_at": at, "cluster_id": cluster, "node_id": node,
        "subject": node, "source": f"agent-{node}", "seq": seq, "faults": [],
        "interval_s": REPORT_INTERVAL_S, "mode": "active", "models": list(models)})
        for node in nodes]


def submission(cluster: str, at: datetime, deadline_s: float) -> MlTaskSubmitted:
    task_id = uuid4()
    return MlTaskSubmitted(
        event_id=uuid4(), source="api", occurred_at=at, cluster_id=cluster,
        subject=str(task_id), task_id=task_id, task_type=TASK_TYPE, input=DIGIT,
        deadline=at + timedelta(seconds=deadline_s), submitted_by="bench")


def answer(command: Command, rng: random.Random, duplicate: bool = False) -> CommandResult:
    """The simulated agent's successful answer to a run_inference command (`duplicate`: to
    one it answered already, as the agent marks its cached answer)."""
    payload = CommandPayload.model_validate_json(unb64url(command.payload))
    action = payload.action
    if not isinstance(action, RunInference):
        raise ValueError(f"not a run_inference command: {action.action}")
    inference = InferenceOutput(
        task_id=action.task_id, attempt=action.attempt, task_type=action.task_type,
        model=action.model, version=action.version, latency_ms=round(rng.uniform(0.2, 2.0), 3),
        prediction=rng.randrange(10), confidence=0.99)
    return CommandResult(
        event_id=uuid4(), source=f"agent-{payload.node_id}", occurred_at=now_utc(),
        cluster_id=command.cluster_id, subject=payload.node_id,
        command_id=payload.command_id, node_id=payload.node_id, task_id=action.task_id,
        action="run_inference", outcome="succeeded", duplicate=duplicate, inference=inference)


def commandstats_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, int]:
    """Calls per command between two INFO commandstats replies (commands that ran only)."""
    out: dict[str, int] = {}
    for name, stats in after.items():
        calls = int(stats["calls"]) - int(before.get(name, {}).get("calls", 0))
        if calls > 0:
            out[name.removeprefix("cmdstat_")] = calls
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("nan")


@dataclass
class CaseResult:
    """The figures of one concurrency."""

    concurrency: int
    tasks: int
    submit_s: float = 0.0
    result_s: float = 0.0
    closed_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    waits: int = 0
    timeouts: int = 0
    failed: int = 0
    transient: int = 0
    errors: int = 0
    duplicates: int = 0
    server_cmds: dict[str, int] = field(default_factory=dict)
    client_cmds: int = 0
    round_trips: int = 0
    wave_client: tuple[int, int] = (0, 0)   # client commands: submission phase, result phase
    wave_trips: tuple[int, int] = (0, 0)    # round trips: submission phase, result phase

    def row(self) -> dict[str, Any]:
        n = self.tasks
        return {
            "concurrency": self.concurrency, "tasks": n,
            "submissions_per_s": round(rate(n, self.submit_s), 1),
            "results_per_s": round(rate(n, self.result_s), 1),
            "tasks_per_s": round(rate(n, self.closed_s), 1),
            "p50_ms": round(percentile(self.latencies_ms, 0.5), 2) if self.latencies_ms else None,
            "p99_ms": round(percentile(self.latencies_ms, 0.99), 2) if self.latencies_ms else None,
            "waits": self.waits, "timeouts": self.timeouts, "failed": self.failed,
            "duplicate_commands": self.duplicates,
            "transient_errors": self.transient, "handler_errors": self.errors,
            "redis_cmds_per_task": round(sum(self.server_cmds.values()) / n, 1),
            "client_cmds_per_task": round(self.client_cmds / n, 1),
            "round_trips_per_task": round(self.round_trips / n, 1),
            "client_cmds_per_submission": round(self.wave_client[0] / n, 1),
            "client_cmds_per_result": round(self.wave_client[1] / n, 1),
            "round_trips_per_submission": round(self.wave_trips[0] / n, 1),
            "round_trips_per_result": round(self.wave_trips[1] / n, 1),
            "server_cmds_per_task": {k: round(v / n, 2) for k, v in self.server_cmds.items()},
        }


TABLE_COLUMNS = (("C", "concurrency"), ("submissions/s", "submissions_per_s"),
                 ("results/s", "results_per_s"), ("tasks/s (closed loop)", "tasks_per_s"),
                 ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"), ("waits", "waits"),
                 ("timeouts", "timeouts"), ("failed", "failed"),
                 ("duplicate commands", "duplicate_commands"),
                 ("Redis cmds/task (server)", "redis_cmds_per_task"),
                 ("cmds/task (client)", "client_cmds_per_task"),
                 ("round trips/task", "round_trips_per_task"))


def table(rows: Iterable[Mapping[str, Any]]) -> str:
    """The figures as a Markdown table."""
    lines = ["| " + " | ".join(title for title, _ in TABLE_COLUMNS) + " |",
             "|" + "---|" * len(TABLE_COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(str(row[key]) for _, key in TABLE_COLUMNS) + " |")
    return "\n".join(lines)
