"""docs/reliability.md S25 on the real broker, Redis and a real agent process: two executors
move two jobs off one node at once. Each takes its command's seq from the node's counter in
Redis and publishes in a second step, and the one that took the later seq publishes first.
The agent takes both (within its seq window), each once; with a window of 0, strict order,
the other move is refused `stale_seq` and its task would fail for nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import fleet
from common.messaging import ensure_topics
from common.signing import ensure_keypair, signer_from_file
from schemas.events.v1 import MigrateJob, now_utc
from schemas.topics import Topic
from services.executor.journal import Journal
from services.shared.redis_client import Keys, connect_redis
from tests.integration.harness import name, producer, tap
from tests.integration.test_command_security import (
    CLUSTER,
    NODE,
    agent_log_on_failure,
    answered,
    answers_to,
    journal_rows,
    payload,
)

JOBS = (f"{NODE}.train", f"{NODE}.infer")


@pytest.mark.parametrize(("window", "late_outcome"), [("600000", ("succeeded", "")),
                                                      ("0", ("rejected", "stale_seq"))])
async def test_two_moves_off_one_node_from_two_executors_are_both_taken(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path, window: str,
    late_outcome: tuple[str, str],
) -> None:
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "WARDEN_LOG_LEVEL": "INFO",
           "AGENT_JOBS": "sim", "AGENT_PEER_PROBES": "0", "AGENT_COMMAND_SEQ_WINDOW": window}
    private, public = ensure_keypair(tmp_path / "keys", "executor")
    signer = signer_from_file(private)
    await ensure_topics(kafka_bootstrap, namespace)
    keys = Keys(namespace)
    # Two executors: two connections to the node's one counter.
    first, second = connect_redis(redis_url), connect_redis(redis_url)
    fleet.fleet_up(1, 2, CLUSTER, namespace, tmp_path, env, [public], 1.0)
    try:
        async with (agent_log_on_failure(tmp_path), producer(kafka_bootstrap) as prod,
                    tap(kafka_bootstrap, name(Topic.NODE_COMMAND_RESULTS, namespace),
                        name(Topic.NODE_REPORTS, namespace)) as watch):
            await watch.wait_for(
                lambda r: r.topic.endswith(Topic.NODE_REPORTS.value) and r.key == NODE.encode(),
                60, f"{NODE} reporting")
            seq_a = await Journal(first, keys).next_command_seq(CLUSTER, NODE, now_utc())
            seq_b = await Journal(second, keys).next_command_seq(CLUSTER, NODE, now_utc())
            assert seq_b > seq_a
            # Two tasks, two epochs, one job each; the later seq goes out first.
            move_a = payload(MigrateJob(node_id=NODE, job_id=JOBS[0]), seq=seq_a, epoch=11)
            move_b = payload(MigrateJob(node_id=NODE, job_id=JOBS[1]), seq=seq_b, epoch=12)
            for move in (move_b, move_a):
                command = signer.sign(move, "executor-itest")
                await prod.send_and_wait(name(Topic.NODE_COMMANDS, namespace),
                                         command.model_dump_json().encode(),
                                         key=command.subject.encode())
            await watch.wait_for(answered(watch, move_b.command_id), 90, "the later seq's move")
            await watch.wait_for(answered(watch, move_a.command_id), 90, "the earlier seq's")
            # Long actions answer once, when done.
            assert [(r.outcome, r.reason) for r in answers_to(watch, move_b.command_id)] == [
                ("succeeded", "")]
            assert [(r.outcome, r.reason) for r in answers_to(watch, move_a.command_id)] == [
                late_outcome]
        rows = {row[0]: row for row in journal_rows(tmp_path)}
        assert rows[str(move_b.command_id)][2] == "succeeded"
        assert rows[str(move_a.command_id)][2] == late_outcome[0]
    finally:
        fleet.fleet_down(tmp_path)
        await first.aclose()
        await second.aclose()
