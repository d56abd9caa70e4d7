"""Reports every non-local cluster's pending jobs as queued demand, every period.

For each cluster the collector knows whose registration names a backend (Kubernetes), the
cluster's backend is opened once and kept (its list + watch keeps the nodes and pods current,
services/backends/opened.py); each period its `queued_demand` (the pending GPU pods per pool,
net of the GPUs on their way) is written as the `pending_jobs` source of each pool's demand
(services/shared/demand.py), which the analyzer adds into the scale need. Every pool the
collector knows gets its figure, 0 included, so demand ends when the pods are placed, not
only when the entry times out. One instance reports per period (a sweep lock); the opened
backends are caches, rebuilt by a list when a process starts: nothing lives only here.
"""

from __future__ import annotations

import logging
import time

from redis.asyncio import Redis

from common.clock import EpochClock
from services.backends.base import BackendError, PoolDemand
from services.backends.opened import OpenedBackends
from services.shared.demand import PENDING_JOBS, report_demand
from services.shared.redis_client import Keys, text

log = logging.getLogger("clusterwarden.inventory")


class DemandReporter:
    def __init__(self, redis: Redis, keys: Keys, backends: OpenedBackends, *, period_s: float,
                 ttl_s: float, clock: EpochClock = time.time) -> None:
        self.redis = redis
        self.keys = keys
        self.backends = backends
        self.period_s = period_s
        self.ttl_s = ttl_s
        self.clock = clock

    async def tick(self) -> None:
        if not await self.redis.set(self.keys.sweep_lock("pending-jobs"), b"1", nx=True,
                                    px=int(self.period_s * 900)):
            return
        for cluster in sorted(text(c) for c in await self.redis.smembers(self.keys.clusters())):
            try:
                await self.report(cluster)
            except Exception:
                # One cluster's broken registration or API server never stops the others'.
                log.exception("cluster %s: reporting its queued demand failed", cluster)

    async def report(self, cluster: str) -> None:
        """One cluster's pending jobs per pool; nothing (the entries lapse) if its backend
        cannot say."""
        config = await self.backends.config(cluster)
        if config.kind == "local":
            # ClusterWarden's own agents: nothing queues jobs outside the router and scheduler.
            await self.backends.forget(cluster)
            return
        try:
            backend = await self.backends.backend(cluster, config)
            queued = {d.pool: d for d in await backend.queued_demand(config.default_pool)}
        except BackendError as err:
            log.warning("cluster %s: no queued demand this period: %s", cluster, err)
            return
        known = {text(p) for p in await self.redis.smembers(self.keys.pools(cluster))}
        now = self.clock()
        for pool in sorted(known | set(queued)):
            demand = queued.get(pool, PoolDemand(pool=pool, items=0, gpus=0))
            await report_demand(self.redis, self.keys, cluster, pool, PENDING_JOBS,
                                items=demand.items, gpus=float(demand.gpus), now=now,
                                ttl_s=self.ttl_s)
            if demand.items:
                log.info("cluster %s pool %s: %d pending GPU pod(s), %d GPUs queued "
                         "(%d on their way)", cluster, pool, demand.items, demand.gpus,
                         demand.on_the_way)
