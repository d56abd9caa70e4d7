"""The inventory's queued demand on the real API server (kwok nodes, the real scheduler) and
the real Redis: each registered Kubernetes cluster's pending GPU pods, per pool (the pool they
select, else the cluster's default pool), net of the GPUs on their way, written as the
`pending_jobs` source of each pool's demand; kept current by the backend's watch (no list
after the first); a local cluster is left to its agents."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client
from redis.asyncio import Redis

from schemas.kubernetes import CAPACITY_ANNOTATION, STANDBY_LABEL
from services.backends.kubernetes.backend import KubernetesBackend
from services.backends.kubernetes.capacity import CapacityRecord
from services.backends.kubernetes.connection import KubeAccess
from services.backends.opened import OpenedBackends
from services.inventory.reporter import DemandReporter
from services.shared.demand import PENDING_JOBS, DemandEntry, parse_entries
from services.shared.redis_client import Keys
from services.shared.registry import CapacityKind, ClusterBackend, set_cluster_backend
from tests.kube import SCOPE_LABEL, KubeScope, settled

KUBE_CLUSTER, LOCAL_CLUSTER = "gpu-east", "lab"
DEFAULT_POOL = "train"


@pytest.fixture
async def backends(redis: Redis, keys: Keys) -> AsyncIterator[OpenedBackends]:
    opened = OpenedBackends(redis, keys)
    try:
        yield opened
    finally:
        await opened.close()


async def register(redis: Redis, keys: Keys, kube_api: KubeAccess, pools: list[str], *,
                   capacity: CapacityKind = "standby", capacity_namespace: str = "default",
                   ) -> None:
    """The Kubernetes cluster and a local one, as the collector knows them."""
    assert kube_api.kubeconfig is not None
    await set_cluster_backend(redis, keys, KUBE_CLUSTER, ClusterBackend(
        kind="kubernetes", kubeconfig=kube_api.kubeconfig, default_pool=DEFAULT_POOL,
        capacity=capacity, capacity_namespace=capacity_namespace))
    await redis.sadd(keys.clusters(), KUBE_CLUSTER, LOCAL_CLUSTER)
    await redis.sadd(keys.pools(KUBE_CLUSTER), *pools)
    await redis.sadd(keys.pools(LOCAL_CLUSTER), DEFAULT_POOL)


async def demand(redis: Redis, keys: Keys, cluster: str = KUBE_CLUSTER) -> dict[str, DemandEntry]:
    """Each pool's pending_jobs entry."""
    entries = {}
    for pool in ("train", "infer", "idle"):
        raw = await redis.hgetall(keys.demand_sources(cluster, pool))
        if (entry := parse_entries(raw).get(PENDING_JOBS)) is not None:
            entries[pool] = entry
    return entries


def figures(entries: dict[str, DemandEntry]) -> dict[str, tuple[int, float]]:
    return {pool: (e.items, e.gpus) for pool, e in entries.items()}


async def reported(reporter: DemandReporter, redis: Redis, keys: Keys,
                   expected: dict[str, tuple[int, float]]) -> dict[str, DemandEntry]:
    """Runs the reporter's period until the entries say `expected` (the watch brings changes
    within moments; each period the figures are written again)."""
    async def check() -> dict[str, DemandEntry] | None:
        await redis.delete(keys.sweep_lock("pending-jobs"))  # this test's periods, at once
        await reporter.tick()
        entries = await demand(redis, keys)
        return entries if figures(entries) == expected else None

    return await settled(check, f"pending_jobs demand {expected}")


async def test_pending_gpu_pods_are_each_pools_queued_demand_net_of_nodes_on_their_way(
        kube: KubeScope, kube_api: KubeAccess, redis: Redis, keys: Keys,
        backends: OpenedBackends) -> None:
    await kube.add_gpu_node("a")
    # Two 8-GPU pods on one 8-GPU node: one runs, one waits (for the default pool).
    await kube.add_gpu_statefulset("big", 2, gpus=8)
    # A pod selecting pool infer, which has no node: it waits there.
    await kube.add_gpu_statefulset("serve", 1, gpus=4, pool="infer")
    await register(redis, keys, kube_api, ["train", "infer", "idle"])
    reporter = DemandReporter(redis, keys, backends, period_s=1.0, ttl_s=30.0,
                              clock=lambda: 1_000.0)
    entries = await reported(reporter, redis, keys,
                             {"train": (1, 8.0), "infer": (1, 4.0), "idle": (0, 0.0)})
    assert {e.until for e in entries.values()} == {1_030.0}
    # The local cluster's pools are its agents' and the router's: nothing written for them.
    assert await redis.hgetall(keys.demand_sources(LOCAL_CLUSTER, DEFAULT_POOL)) == {}
    assert backends.clusters() == [KUBE_CLUSTER]

    # A standby node ClusterWarden added to pool train that is not Ready yet (no kubelet, and
    # not one the waiting pod selects): its 8 GPUs are on their way to the pod's.
    record = CapacityRecord(task_id="t-1", step="0:add-capacity", pool="train")
    await kube.add_gpu_node("coming", kwok=False,
                            labels={STANDBY_LABEL: "true", SCOPE_LABEL: f"{kube.prefix}-other"},
                            annotations={CAPACITY_ANNOTATION: record.to_json()})
    await reported(reporter, redis, keys,
                   {"train": (1, 0.0), "infer": (1, 4.0), "idle": (0, 0.0)})

    # The waiting infer pod goes away: its demand ends with it, seen by the watch.
    await client.AppsV1Api(kube.api).delete_namespaced_stateful_set("serve", kube.namespace)
    await reported(reporter, redis, keys,
                   {"train": (1, 0.0), "infer": (0, 0.0), "idle": (0, 0.0)})
    backend = await backends.backend(KUBE_CLUSTER)
    assert isinstance(backend, KubernetesBackend)
    assert backend.cache.lists == 2  # nodes and pods, once each


async def test_a_machine_deployments_replicas_without_a_node_are_on_their_way(
        kube: KubeScope, kube_api: KubeAccess, redis: Redis, keys: Keys,
        backends: OpenedBackends) -> None:
    await kube.add_gpu_node("a")
    await kube.add_gpu_statefulset("big", 2, gpus=8)
    # Node a is one of its machines; two more were asked for and have no Node yet.
    await kube.add_machine_deployment(DEFAULT_POOL, replicas=3, gpus=8)
    await register(redis, keys, kube_api, ["train"], capacity="machinedeployment",
                   capacity_namespace=kube.namespace)
    reporter = DemandReporter(redis, keys, backends, period_s=1.0, ttl_s=30.0)
    entries = await reported(reporter, redis, keys, {"train": (1, 0.0)})
    assert entries["train"].items == 1

    # Scaled back to its one machine: nothing on the way, the pod's 8 GPUs are queued again.
    await kube.set_machine_deployment_replicas(DEFAULT_POOL, 1)
    await reported(reporter, redis, keys, {"train": (1, 8.0)})
