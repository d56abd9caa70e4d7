"""deploy/compose.yaml as deployed: validated by a real compose implementation, then its
services run as local processes (tests/integration/compose_processes.py) from nothing but
what the file says. The secrets service makes every key and token, the agents enrol
themselves with the bootstrap token, every service passes its own healthcheck, and a GPU
fault on node-001 takes it offline and moves its training job to another node."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from redis.asyncio import Redis

from agent.faults import FaultPlan, write_faults
from schemas.topics import Topic
from services.shared.redis_client import Keys, connect_redis
from services.shared.registry import registered_nodes
from tests.chaos.harness import all_up
from tests.integration.compose_processes import (
    COMPOSE_FILE,
    ROOT,
    Infrastructure,
    compose_binary,
    local_stack,
)
from tests.integration.harness import name, tap, until
from tests.integration.test_remediation import family, finished, step_outputs

NODES = ["node-001", "node-002", "node-003"]
CLUSTER = "local"  # the compose file's WARDEN_CLUSTER_ID


def test_a_real_compose_implementation_takes_the_file() -> None:
    checked = subprocess.run([str(compose_binary()), "-f", str(COMPOSE_FILE), "config", "-q"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr


@pytest.mark.timeout(600)
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)  # as compose runs
async def test_the_compose_stack_enrols_its_agents_and_takes_a_faulty_node_offline(
    kafka_bootstrap: str, redis_url: str, database_url: str, alertmanager_url: str,
    namespace: str, tmp_path: Path,
) -> None:
    infrastructure = Infrastructure(kafka_bootstrap, redis_url, database_url, alertmanager_url,
                                    namespace)
    with local_stack(tmp_path, infrastructure) as stack:
        keys = stack.volume("keys")
        # The secrets service made every key a process needs, owner-only where secret.
        for secret in ("executor.key", "collector.key", "router.key", "report-master.key",
                       "audit.key", "api-tokens", "admin.token"):
            assert (keys / secret).stat().st_mode & 0o077 == 0, secret
        # The agents' mount holds public keys and the bootstrap token only.
        trust = sorted(p.name for p in stack.volume("trust").iterdir())
        assert trust == ["bootstrap.token", "collector.pub", "executor.pub", "router.pub"]

        redis = connect_redis(redis_url)
        try:
            # Enrolled by themselves, through the API: nobody registered them.
            await until(lambda: _enrolled(redis, namespace), 90, "three agents enrolled")
        finally:
            await redis.aclose()
        async with tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                       name(Topic.OPS_NODE_STATE, namespace)) as watch:
            await all_up(watch, NODES)
            write_faults(stack.volume("agent-1"), FaultPlan(xid=[79]))
            await watch.wait_for(lambda _: finished(watch, "node-001"), 300,
                                 "the offline task of node-001 to finish")
            parent, children = family(watch, "node-001")
            assert parent[-1].state == "succeeded", [e.reason for e in parent + children]
            assert children, [e.reason for e in parent]
            assert children[-1].state == "succeeded", [e.reason for e in children]
            # Both of its jobs moved, each out with a checkpoint and into a healthy node.
            by_child = [[e for e in children if e.task_id == task_id]
                        for task_id in dict.fromkeys(e.task_id for e in children)]
            moved = {str(step_outputs(events, "migrate_job")["job_id"]) for events in by_child}
            started = {str(step_outputs(events, "start_job")["job_id"]) for events in by_child}
            assert moved == started == {"node-001.train", "node-001.infer"}
        assert stack.dead() == [], [stack.tail(n) for n in stack.dead()]


async def _enrolled(redis: Redis, namespace: str) -> bool:
    return sorted(await registered_nodes(redis, Keys(namespace), CLUSTER)) == NODES
