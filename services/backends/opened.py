"""Each non-local cluster's backend, opened from its registration and kept open.

Opening a backend is costly (a Kubernetes backend lists every node and pod, then watches
them), so a process opens one per cluster and keeps it for its life, opening it again only
when the registration (services/shared/registry.py `ClusterBackend`) changes. The executor
runs steps through them; the inventory service reads their queued demand.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from services.backends.base import Backend
from services.backends.budget import TokenBucket
from services.shared.redis_client import Keys
from services.shared.registry import ClusterBackend, cluster_backend

log = logging.getLogger("clusterwarden.backends")

Opener = Callable[[ClusterBackend], Awaitable[Backend]]


async def open_kubernetes(config: ClusterBackend) -> Backend:
    """The Kubernetes backend of a cluster, with its eviction budget (the caller closes it)."""
    from services.backends.kubernetes.actuator import CapacitySource
    from services.backends.kubernetes.backend import KubernetesBackend
    from services.backends.kubernetes.connection import KubeAccess

    access = KubeAccess(kubeconfig=config.kubeconfig or None, context=config.context or None)
    budget = TokenBucket(config.evictions_per_s, config.eviction_burst)
    capacity = CapacitySource(config.capacity, config.capacity_namespace)
    return await KubernetesBackend.open(access, budget, capacity=capacity,
                                        default_pool=config.default_pool)


OPENERS: dict[str, Opener] = {"kubernetes": open_kubernetes}


class OpenedBackends:
    """One opened backend per cluster (its watches, its eviction budget), opened on first use
    and again when the cluster's registration changes."""

    def __init__(self, redis: Redis, keys: Keys, *,
                 openers: dict[str, Opener] | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.openers: dict[str, Opener] = openers or OPENERS
        self._open: dict[str, tuple[ClusterBackend, Backend]] = {}
        self._lock = asyncio.Lock()

    async def config(self, cluster: str) -> ClusterBackend:
        return await cluster_backend(self.redis, self.keys, cluster)

    async def backend(self, cluster: str,
                      config: ClusterBackend | None = None) -> Backend:
        """The cluster's opened backend (opened again if its registration changed)."""
        config = config or await self.config(cluster)
        async with self._lock:
            opened = self._open.get(cluster)
            if opened is not None and opened[0] == config:
                return opened[1]
            if opened is not None:
                await close_backend(opened[1])
                del self._open[cluster]
            backend = await self.openers[config.kind](config)
            self._open[cluster] = (config, backend)
            return backend

    async def forget(self, cluster: str) -> None:
        """Closes the cluster's backend, if one is open (it went back to `local`)."""
        async with self._lock:
            opened = self._open.pop(cluster, None)
        if opened is not None:
            await close_backend(opened[1])

    def clusters(self) -> list[str]:
        """The clusters with a backend open now."""
        return sorted(self._open)

    async def close(self) -> None:
        async with self._lock:
            for _, backend in self._open.values():
                await close_backend(backend)
            self._open.clear()


async def close_backend(backend: Backend) -> None:
    close = getattr(backend, "close", None)
    if close is not None:
        try:
            await close()
        except Exception:  # closing must never be why a step or a report fails
            log.exception("closing a backend failed")
