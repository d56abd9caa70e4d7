"""The inventory on a real API server: GPU nodes, GPU pods per node and pending GPU pods,
kept current by the watch (no list after the first)."""

from __future__ import annotations

from services.backends.base import Inventory
from services.backends.budget import TokenBucket
from services.backends.kubernetes.backend import KubernetesBackend
from services.backends.kubernetes.connection import KubeAccess
from tests.kube import KubeScope, settled


def mine(inventory: Inventory, kube: KubeScope) -> Inventory:
    return Inventory(
        nodes=tuple(n for n in inventory.nodes if n.name.startswith(kube.prefix)),
        pods_by_node={n: p for n, p in inventory.pods_by_node.items()
                      if n.startswith(kube.prefix)},
        pending=tuple(p for p in inventory.pending if p.namespace == kube.namespace))


async def test_inventory_follows_nodes_gpu_pods_and_pending_demand_by_watch(
        kube: KubeScope, backend: KubernetesBackend) -> None:
    lists = backend.cache.lists
    node = await kube.add_gpu_node("a")
    await kube.add_gpu_statefulset("small", 2, gpus=3)
    await kube.add_gpu_statefulset("huge", 1, gpus=16)

    async def placed_and_pending() -> Inventory | None:
        seen = mine(await backend.inventory(), kube)
        placed = [p for p in seen.pods_by_node.get(node, ()) if p.phase == "Running"]
        return seen if len(placed) == 2 and seen.pending and seen.nodes[0].ready else None

    inventory = await settled(placed_and_pending,
                              "two small pods Running and the huge one pending")
    [gpu_node] = inventory.nodes
    assert (gpu_node.name, gpu_node.capacity, gpu_node.allocatable) == (node, 8, 8)
    assert sorted(p.name for p in inventory.pods_by_node[node]) == ["small-0", "small-1"]
    assert [(p.name, p.gpus, p.node) for p in inventory.pending] == [("huge-0", 16, None)]
    assert inventory.pending_gpus == 16

    await kube.core.patch_node(node, {"spec": {"unschedulable": True}})
    await settled(lambda: _unschedulable(backend, node), "the cordon seen by the watch")
    assert backend.cache.lists == lists


async def _unschedulable(backend: KubernetesBackend, node: str) -> bool:
    return any(n.name == node and not n.schedulable for n in (await backend.inventory()).nodes)


async def test_a_watch_the_server_ends_resumes_from_its_resource_version(
        kube: KubeScope, kube_api: KubeAccess, budget: TokenBucket) -> None:
    # The server ends each watch after a second: the cache must go on from where it was,
    # seeing every change, without listing again.
    backend = await KubernetesBackend.open(kube_api, budget, watch_timeout_s=1)
    try:
        first = await kube.add_gpu_node("a")
        await settled(lambda: _known(backend, first), "the first node seen")
        opened = backend.cache.watches
        await settled(lambda: _reopened(backend, opened + 2), "two more watches opened")
        later = await kube.add_gpu_node("b")
        await settled(lambda: _known(backend, later), "a node made after the watch ended")
        assert backend.cache.lists == 2
    finally:
        await backend.close()


async def _known(backend: KubernetesBackend, node: str) -> bool:
    return any(n.name == node for n in (await backend.inventory()).nodes)


async def _reopened(backend: KubernetesBackend, watches: int) -> bool:
    return backend.cache.watches >= watches
