"""docs/reliability.md S4 on the real broker, Redis and agent processes: the executor dies (as a
kill -9) right after it sent a drain. Restarted, it completes the task and the agent has
drained once: with the agent's answer still on the results topic, from that answer; with the
answer lost, by asking the agent (query_status), which answers from its journal."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from agent import fleet
from agent.journal import JOURNAL_FILE
from common.signing import ensure_signer_keys
from schemas.events.v1 import TaskEvent
from schemas.topics import Topic
from services.shared.registry import register
from tests.integration.harness import (
    Record,
    is_success_of,
    is_up,
    name,
    services,
    stack_env,
    tap,
    task_events_for,
    until,
)
from tests.integration.test_operator_control import UPKEEP_ACTIONS
from warden import launcher

NODES = ["node-001", "node-002"]
TARGET = "node-002"


def journal_rows(state_dir: Path, node: str) -> list[tuple[str, str, str, str, str]]:
    """(command_id, action, outcome, reason, result_json) of every row of an agent's journal."""
    path = fleet.agent_dir(state_dir, node) / JOURNAL_FILE
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [(str(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4])) for r in db.execute(
            "SELECT command_id, action, outcome, reason, result_json FROM commands"
            " ORDER BY recorded_at")]
    finally:
        db.close()


def one_attempt(events: list[TaskEvent]) -> bool:
    """The drain step was started once, as its first attempt, and never failed."""
    starts = [e for e in events if e.step_index == 0 and e.step_state == "started"
              and "attempt" in e.reason]
    failed = [e for e in events if e.step_index == 0 and e.step_state == "failed"]
    return len(starts) == 1 and "attempt 1" in starts[0].reason and not failed


async def lose_records_up_to(bootstrap: str, record: Record) -> None:
    """Delete `record` and everything before it on its partition (as retention would)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_records(
            {TopicPartition(record.topic, record.partition): RecordsToDelete(record.offset + 1)})
    finally:
        await admin.close()


@pytest.mark.parametrize("answer", ["on_the_bus", "lost"])
async def test_an_executor_killed_after_sending_a_drain_completes_it_once_after_restart(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path, answer: str
) -> None:
    env = stack_env(
        kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
        AGENT_JOBS="", ANALYZER_ENABLED_NEEDS='["offline"]',
        # No centre probes: the agent's journal holds only what the task sent.
        COLLECTOR_PROBE_PERIOD_S="3600",
        # Two nodes, one faulty: half the pool unhealthy, one node of budget.
        SCHEDULER_SHORT_CIRCUIT_UNHEALTHY_FRACTION="0.9",
        SCHEDULER_OFFLINE_BUDGET_FRACTION="1.0",
        EXECUTOR_CRASH_AT="after_send:drain_node",
    )
    healthy_env = {k: v for k, v in env.items() if k != "EXECUTOR_CRASH_AT"}
    trusted = ensure_signer_keys(tmp_path / "keys")
    async with services(env, tmp_path) as running:
        await register(redis_url, namespace, "itest", NODES)
        fleet.fleet_up(len(NODES), 1, "itest", namespace, tmp_path, env, trusted, 1.0)
        try:
            async with tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                           name(Topic.OPS_NODE_STATE, namespace),
                           name(Topic.NODE_COMMAND_RESULTS, namespace)) as watch:
                for node in NODES:
                    await watch.wait_for(is_up(node), 90, f"{node} up")

                fleet.inject_fault(tmp_path, TARGET, xid=[79])
                index = next(i for i, s in enumerate(running) if s.name == "executor")
                crashed = running[index]
                await until(lambda: crashed.process.poll() is not None, 120,
                            "the executor to die right after sending the drain")
                assert crashed.process.returncode == 137
                assert "crash_at after_send:drain_node" in crashed.log_path.read_text(
                    errors="replace")
                # The drain went out before the crash, and the step was journaled as started.
                await watch.wait_for(
                    lambda _: any(e.step_index == 0 and e.step_state == "started"
                                  for e in task_events_for(watch, TARGET)),
                    30, "the drain step started")
                drain = next(e for e in task_events_for(watch, TARGET)
                             if e.step_index == 0 and e.step_state == "started")
                assert drain.command_id is not None
                drain_id = str(drain.command_id)
                # The agent got it and drained, with nobody left to hear the answer.
                result = await watch.wait_for(
                    lambda r: r.topic.endswith(Topic.NODE_COMMAND_RESULTS.value)
                    and drain_id.encode() in r.value, 30, "the agent's answer to the drain")
                assert [(r[0], r[2]) for r in journal_rows(tmp_path, TARGET)
                        if r[1] not in UPKEEP_ACTIONS] == [(drain_id, "succeeded")]
                if answer == "lost":
                    await lose_records_up_to(kafka_bootstrap, result)

                # Restarted without the hook (the crashed one counts as replaced).
                running[index] = launcher.start_services(tmp_path, healthy_env,
                                                         ("executor",))[0]
                await watch.wait_for(is_success_of(watch, TARGET), 120,
                                     "the offline task to succeed after the restart")

                events = task_events_for(watch, TARGET)
                assert [e.state for e in events][-1] == "succeeded", [e.reason for e in events]
                asked = [e for e in events
                         if e.step_index == 0 and "asked the agent for the status" in e.reason]
                if answer == "lost":
                    # Nothing on the bus: the restarted executor asked the agent.
                    assert asked, [e.reason for e in events]
                # Never sent again: the agent's journal had it.
                assert not any("sent again" in e.reason for e in events), \
                    [e.reason for e in events]
                drained = next(e for e in events
                               if e.step_index == 0 and e.step_state == "completed")
                assert drained.command_id == drain.command_id
                assert drained.outputs.get("mode") == "draining", drained.outputs
                assert one_attempt(events)

            rows = journal_rows(tmp_path, TARGET)
            # Exactly one drain executed (a duplicate is answered from the journal without
            # a row of its own); with the answer lost, recovery was one status query.
            drains = [row for row in rows if row[1] == "drain_node"]
            assert [(r[0], r[2]) for r in drains] == [(drain_id, "succeeded")], rows
            queries = [json.loads(row[4]) for row in rows if row[1] == "query_status"]
            if answer == "lost":
                assert [(q["outputs"].get("queried_command_id"), q["outcome"])
                        for q in queries] == [(drain_id, "succeeded")], rows
            offline = [row for row in rows if row[1] == "offline_node"]
            assert [r[2] for r in offline] == ["succeeded"], rows
        finally:
            fleet.fleet_down(tmp_path)

