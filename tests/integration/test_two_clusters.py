"""One control centre, two clusters: the same node name in each, kept apart end to end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agent import fleet
from common.signing import ensure_keypair
from schemas.events.v1 import OpsNeed, PoolHealth
from schemas.topics import Topic
from services.shared.registry import register
from tests.integration.harness import Record, name, services, stack_env, tap


def health_of(cluster: str) -> Callable[[Record], bool]:
    def check(record: Record) -> bool:
        if not record.topic.endswith(Topic.OPS_POOL_HEALTH.value):
            return False
        health = PoolHealth.model_validate_json(record.value)
        return health.cluster_id == cluster and health.nodes_by_state.get("up") == 2
    return check


def offline_need(record: Record) -> bool:
    return record.topic.endswith(Topic.OPS_NEEDS.value)


async def test_two_clusters_with_the_same_node_names_stay_apart(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, AGENT_JOBS="",
                    ANALYZER_POOL_PERIOD_S="1")
    _, public = ensure_keypair(tmp_path / "keys")
    async with services(env, tmp_path, ("collector", "analyzer")):
        fleets = {cluster: tmp_path / cluster for cluster in ("east", "west")}
        try:
            for cluster, state in fleets.items():
                agents = fleet.fleet_up(2, 1, cluster, namespace, state, env, [public], 1.0)
                await register(redis_url, namespace, cluster, [a.node_id for a in agents])
            async with tap(kafka_bootstrap, name(Topic.OPS_NEEDS, namespace),
                           name(Topic.OPS_POOL_HEALTH, namespace)) as watch:
                for cluster in fleets:
                    await watch.wait_for(health_of(cluster), 60, f"{cluster}'s pool health")
                fleet.inject_fault(fleets["west"], "node-001", xid=[79])
                record = await watch.wait_for(offline_need, 60, "an offline need")
                need = OpsNeed.model_validate_json(record.value)
                assert (need.cluster_id, need.target, need.kind) == ("west", "node-001",
                                                                     "offline")
                # A pool period after the need (a fresh record, not one read before): east
                # is still whole, and no need was raised for it meanwhile.
                await watch.wait_for(health_of("east"), 60, "east still healthy after the need",
                                     start=len(watch.records))
                await watch.catch_up()
                needs = [OpsNeed.model_validate_json(r.value) for r in watch.records
                         if offline_need(r)]
                assert {(n.cluster_id, n.target) for n in needs} == {("west", "node-001")}
        finally:
            for state in fleets.values():
                fleet.fleet_down(state)
