"""The router throughput benchmark: its pure parts, and a tiny run on the real Redis (its
events go nowhere: no broker)."""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path
from uuid import uuid4

from bench.router_throughput.run import bench
from bench.router_throughput.workload import (
    CLUSTER,
    MODELS,
    TABLE_COLUMNS,
    CaseResult,
    answer,
    commandstats_delta,
    node_reports,
    served_models,
    submission,
    table,
)
from common.signing import ensure_keypair, signer_from_file, unb64url
from schemas.events.v1 import CommandPayload, NodeReport, RunInference, now_utc
from services.router.decisions import inference_payload
from services.router.policy.selector import Candidate
from services.router.records import AttemptRecord
from services.router.registry import NodeModels, candidates
from services.router.settings import RouterSettings


def test_reports_serve_every_model_on_every_node() -> None:
    now = now_utc()
    reports = node_reports(CLUSTER, ["n1", "n2"], served_models(MODELS, 6), now)
    assert [NodeReport.model_validate_json(r.model_dump_json()) for r in reports] == reports
    entries = [NodeModels(node=r.node_id, seq=r.seq, at=r.occurred_at.timestamp(),
                          interval_s=r.interval_s, mode=r.mode, models=list(r.models))
               for r in reports]
    found: list[Candidate] = candidates(entries, "digits", now.timestamp(), {}, 10.0)
    assert len(found) == 2 * len(MODELS)
    assert all(c.ready and c.max_ongoing == 6 for c in found)


def test_the_simulated_agent_answers_its_command(tmp_path: Path) -> None:
    private, _ = ensure_keypair(tmp_path / "keys", "router")
    now = now_utc()
    task = submission(CLUSTER, now, 30.0)
    assert task.deadline - task.occurred_at == timedelta(seconds=30)
    attempt = AttemptRecord(n=2, model="digits-mlp", version="2", family="mlp", node="n1",
                            command_id=uuid4(), decided_at=now.timestamp(),
                            deadline=now.timestamp() + 3.0, retry=True)
    command = signer_from_file(private).sign(
        inference_payload(task, attempt, now.timestamp()), "router")
    result = answer(command, random.Random(3))
    payload = CommandPayload.model_validate_json(unb64url(command.payload))
    assert isinstance(payload.action, RunInference)
    assert (result.command_id, result.node_id, result.task_id) == (
        attempt.command_id, "n1", task.task_id)
    assert (result.action, result.outcome, result.cluster_id) == (
        "run_inference", "succeeded", CLUSTER)
    assert result.inference is not None
    assert (result.inference.attempt, result.inference.model, result.inference.version,
            result.inference.cause) == (2, "digits-mlp", "2", None)


def test_commandstats_deltas_and_the_table() -> None:
    before = {"cmdstat_get": {"calls": 10, "usec": 5}, "cmdstat_set": {"calls": 4}}
    after = {"cmdstat_get": {"calls": 13}, "cmdstat_set": {"calls": 4},
             "cmdstat_evalsha": {"calls": 7}}
    assert commandstats_delta(before, after) == {"evalsha": 7, "get": 3}
    case = CaseResult(concurrency=2, tasks=4, submit_s=0.5, result_s=0.25, closed_s=1.0,
                      latencies_ms=[1.0, 2.0, 3.0, 4.0], server_cmds={"get": 8},
                      client_cmds=6, round_trips=4)
    row = case.row()
    assert (row["submissions_per_s"], row["results_per_s"], row["tasks_per_s"]) == (
        8.0, 16.0, 4.0)
    assert (row["p50_ms"], row["p99_ms"], row["redis_cmds_per_task"]) == (3.0, 4.0, 2.0)
    lines = table([row]).splitlines()
    assert len(lines) == 3
    assert lines[2].count("|") == len(TABLE_COLUMNS) + 1


async def test_a_tiny_run_on_the_real_redis(redis_url: str, tmp_path: Path) -> None:
    settings = RouterSettings(redis_url=redis_url, namespace=f"u{uuid4().hex[:12]}",
                              cluster_id=CLUSTER, state_dir=str(tmp_path))
    rows = await bench(settings, nodes=2, limit=4, tasks=6, concurrency=[1, 3], warmup=3,
                       publish=False)
    assert [r["concurrency"] for r in rows] == [1, 3]
    for row in rows:
        assert row["tasks"] == 6
        assert (row["waits"], row["timeouts"], row["failed"], row["transient_errors"],
                row["handler_errors"]) == (0, 0, 0, 0, 0)
        assert row["submissions_per_s"] > 0
        assert row["results_per_s"] > 0
        assert row["tasks_per_s"] > 0
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        # The router's own connection: at least a command per round trip.
        assert row["client_cmds_per_task"] >= row["round_trips_per_task"] > 0
        assert row["redis_cmds_per_task"] > 0
