"""The Kubernetes backend: `Backend` carried out through one cluster's API server.

Open it with `KubernetesBackend.open(access, budget)`; it lists and then watches the cluster's
nodes and pods (cache.py) until `close()`. The eviction budget is the caller's, one per cluster.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from kubernetes_asyncio import client

from common.clock import EpochClock
from schemas.events.v1 import TaintEffect
from services.backends.base import (
    CapacityResult,
    DrainResult,
    Inventory,
    NodeResult,
    Outcome,
    PoolDemand,
    StepRef,
)
from services.backends.budget import TokenBucket
from services.backends.kubernetes.actuator import CapacitySource, MachineDeployments, StandbyPool
from services.backends.kubernetes.cache import WATCH_TIMEOUT_S, ClusterCache
from services.backends.kubernetes.connection import KubeAccess, connect
from services.backends.kubernetes.demand import net_demand, queued_by_pool, standby_on_the_way
from services.backends.kubernetes.drain import Drainer
from services.backends.kubernetes.nodes import apply
from services.backends.kubernetes.protocol import (
    decide_drain_cordon,
    decide_offline,
    decide_online,
)


class KubernetesBackend:
    def __init__(self, api: client.ApiClient, budget: TokenBucket, *,
                 clock: EpochClock = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 watch_timeout_s: int = WATCH_TIMEOUT_S,
                 capacity: CapacitySource | None = None,
                 default_pool: str = "default") -> None:
        self.api = api
        self.default_pool = default_pool
        self.budget = budget
        self.core = client.CoreV1Api(api)
        self.cache = ClusterCache(api, watch_timeout_s=watch_timeout_s)
        self._drainer = Drainer(api, self.cache, budget, clock=clock, sleep=sleep)
        self.capacity = capacity or CapacitySource()
        self._standby = StandbyPool(api, self.cache, self._drainer, clock=clock)
        self._machines = MachineDeployments(api, self.cache, self.capacity.namespace,
                                            clock=clock, sleep=sleep)

    @classmethod
    async def open(cls, access: KubeAccess, budget: TokenBucket, *,
                   watch_timeout_s: int = WATCH_TIMEOUT_S,
                   capacity: CapacitySource | None = None,
                   default_pool: str = "default") -> KubernetesBackend:
        """`default_pool`: the pool of the pods and nodes that name none (the cluster's)."""
        api = await connect(access)
        backend = cls(api, budget, watch_timeout_s=watch_timeout_s, capacity=capacity,
                      default_pool=default_pool)
        try:
            await backend.cache.start()
        except BaseException:
            await api.close()
            raise
        return backend

    async def close(self) -> None:
        await self.cache.close()
        await self.api.close()

    async def offline_node(self, node: str, step: StepRef, reason: str, *,
                           effect: TaintEffect = "NoSchedule",
                           dry_run: bool = False) -> NodeResult:
        return await apply(self.api, node,
                           lambda view: decide_offline(view, step, reason, effect),
                           dry_run=dry_run)

    async def online_node(self, node: str, step: StepRef, *,
                          dry_run: bool = False) -> NodeResult:
        return await apply(self.api, node, decide_online, dry_run=dry_run)

    async def drain_node(self, node: str, step: StepRef, *, timeout_s: float,
                         reason: str = "drain", dry_run: bool = False) -> DrainResult:
        """Cordons and claims the node first (as kubectl drain cordons), unless someone
        else owns it: then nothing is evicted and the result says why."""
        cordon = await apply(self.api, node,
                             lambda view: decide_drain_cordon(view, step, reason),
                             dry_run=dry_run)
        if cordon.outcome is Outcome.REFUSED:
            return DrainResult(node=node, refused=cordon.detail, dry_run=dry_run)
        return await self._drainer.drain(node, step, timeout_s=timeout_s, dry_run=dry_run)

    async def add_capacity(self, pool: str, count: int, step: StepRef, *,
                           timeout_s: float = 60.0, dry_run: bool = False) -> CapacityResult:
        """Standby nodes uncordoned, or the pool's MachineDeployment scaled up and its new
        machines' Nodes waited for (actuator.py); `count` 0: enough for the pool's pending GPU
        pods less the GPUs already on their way to it, at least one node."""
        shortfall = await self.shortfall_gpus(pool) if count == 0 else 0
        if self.capacity.kind == "machinedeployment":
            return await self._machines.scale_up(pool, count, step, shortfall_gpus=shortfall,
                                                 timeout_s=timeout_s, dry_run=dry_run)
        return await self._standby.add(pool, count, step, shortfall_gpus=shortfall,
                                       dry_run=dry_run)

    async def shortfall_gpus(self, pool: str) -> int:
        """The GPUs the pool's pending pods want beyond those on their way (as queued_demand
        reports it, for this pool alone)."""
        queued = queued_by_pool(list(self.cache.pods.values()), self.default_pool)
        if pool not in queued:
            return 0
        coming = standby_on_the_way(list(self.cache.nodes.values()))
        return (await self._pool_demand(pool, *queued[pool], coming, self.default_pool)).gpus

    async def remove_capacity(self, pool: str, nodes: tuple[str, ...], step: StepRef, *,
                              count: int = 0, timeout_s: float = 60.0,
                              dry_run: bool = False) -> CapacityResult:
        """Nodes ClusterWarden added cordoned, drained and handed back to standby, or the
        pool's MachineDeployment scaled down, the machines to go marked first (Cluster API
        drains the machines it deletes)."""
        if self.capacity.kind == "machinedeployment":
            return await self._machines.scale_down(pool, count, nodes, step, dry_run=dry_run)
        return await self._standby.remove(pool, nodes, count, step, timeout_s=timeout_s,
                                          dry_run=dry_run)

    async def inventory(self) -> Inventory:
        return self.cache.inventory()

    async def queued_demand(self, default_pool: str) -> tuple[PoolDemand, ...]:
        """The pending GPU pods per pool (demand.py), less the GPUs on their way: standby
        nodes added and not arrived, or a MachineDeployment's machines without a Node yet."""
        queued = queued_by_pool(list(self.cache.pods.values()), default_pool)
        coming = standby_on_the_way(list(self.cache.nodes.values()))
        return tuple([await self._pool_demand(pool, items, gpus, coming, default_pool)
                      for pool, (items, gpus) in sorted(queued.items())])

    async def _pool_demand(self, pool: str, items: int, gpus: int, coming: dict[str, int],
                           default_pool: str) -> PoolDemand:
        """One pool's pending pods net of its standby nodes `coming` and, with Cluster API
        capacity, its MachineDeployment's machines without a Node yet."""
        on_the_way = coming.get(pool, 0)
        if self.capacity.kind == "machinedeployment" and gpus > 0:
            on_the_way += await self._machines.on_the_way(pool, default_pool)
        return net_demand(pool, items, gpus, on_the_way)
