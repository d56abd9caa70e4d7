"""The thin slice on the real broker and Redis: agent processes report, a GPU fault (and a
stopped heartbeat) becomes an offline need, a task, signed commands, and a drained, offline
node; every transition is a TaskEvent."""

from __future__ import annotations

import json
import time
from pathlib import Path

from agent import fleet
from common.signing import ensure_signer_keys
from schemas.topics import Topic
from services.shared.registry import register
from tests.integration.harness import (
    SMALL_POOL_SAFETY,
    is_success_of,
    is_up,
    name,
    services,
    stack_env,
    tap,
    task_events_for,
)


async def test_a_gpu_fault_and_a_stopped_heartbeat_each_become_a_succeeded_offline_task(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path,
                    COLLECTOR_DOWN_AFTER_S="6", WARDEN_LOG_LEVEL="INFO", **SMALL_POOL_SAFETY)
    trusted = ensure_signer_keys(tmp_path / "keys")
    async with services(env, tmp_path):
        agents = fleet.fleet_up(3, 2, "itest", namespace, tmp_path, env, trusted, 1.0)
        await register(redis_url, namespace, "itest", [a.node_id for a in agents])
        try:
            async with tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                           name(Topic.OPS_NODE_STATE, namespace)) as watch:
                # Every agent is seen up before anything goes wrong.
                for node in ("node-001", "node-002", "node-003"):
                    await watch.wait_for(is_up(node), 120, f"{node} up")

                fault_at = time.monotonic()
                fleet.inject_fault(tmp_path, "node-002", xid=[79])
                await watch.wait_for(is_success_of(watch, "node-002"), 120,
                                     "the offline task for node-002 to succeed")
                fault_to_success = time.monotonic() - fault_at

                # Silent and cut off from its peers: down. (Silent while its peers still
                # reach it would be a dead agent on a live node, restarted, not taken offline.)
                fleet.inject_fault(tmp_path, "node-003", silent=True, partitioned=True)
                await watch.wait_for(
                    lambda r: r.key == b"node-003" and b'"state":"down"' in r.value, 60,
                    "node-003 down after its heartbeat stopped")
                await watch.wait_for(is_success_of(watch, "node-003"), 120,
                                     "the offline task for node-003 to succeed")

                # The healthy node was left alone.
                assert task_events_for(watch, "node-001") == []

                gpu_fault = task_events_for(watch, "node-002")
                trail = [(e.state, e.step_index, e.step_state) for e in gpu_fault]
                assert trail[:8] == [
                    ("created", None, None),
                    ("queued", None, None),
                    ("dispatched", None, None),
                    ("running", None, None),
                    ("running", 0, "started"),
                    ("running", 0, "completed"),
                    ("running", 1, "started"),
                    ("running", 1, "completed"),
                ]
                assert trail[-1] == ("succeeded", None, None)
                # Then capacity (if the pool is above its range without node-002), its jobs
                # moved to the other nodes by child tasks, and capacity again: each step ends
                # completed or, when its guard does not hold on fresh state, skipped.
                ended = {e.step_index: e.step_state for e in gpu_fault
                         if e.step_state in ("completed", "skipped", "failed")}
                assert ended[3] == "completed"
                assert {ended[2], ended[4]} <= {"completed", "skipped"}
                created = gpu_fault[0].task
                assert created is not None
                assert created.evidence[0].metric == "node_fault_count"
                assert "xid 79" in created.evidence[0].detail
                assert gpu_fault[5].outputs.get("mode") == "draining"
                assert gpu_fault[7].outputs.get("mode") == "offline"

                heartbeat = task_events_for(watch, "node-003")
                assert heartbeat[0].task is not None
                assert heartbeat[0].task.evidence[0].metric == "heartbeat_missed"

                # Trace context travels in Kafka headers.
                assert all(dict(r.headers).get("traceparent") for r in watch.records)

                # The node says so itself: its reports now carry mode offline.
                await watch.wait_for(
                    lambda r: r.key == b"node-002"
                    and json.loads(r.value).get("state") == "offline",
                    30, "node-002 reported offline")
            print(f"\nfault report -> task succeeded: {fault_to_success:.2f} s")
        finally:
            fleet.fleet_down(tmp_path)
