"""Node enrolment: the collector uses only reports from nodes registered in their cluster;
and each cluster's backend: what carries out its node steps (local agents, Kubernetes)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Literal

from redis.asyncio import Redis

from services.shared.redis_client import Keys, connect_redis, text


async def register_nodes(redis: Redis, keys: Keys, cluster: str, nodes: Iterable[str]) -> int:
    """Enrol nodes (idempotent); returns how many were new."""
    names = list(nodes)
    return int(await redis.sadd(keys.registry(cluster), *names)) if names else 0


async def deregister_nodes(redis: Redis, keys: Keys, cluster: str, nodes: Iterable[str]) -> int:
    names = list(nodes)
    return int(await redis.srem(keys.registry(cluster), *names)) if names else 0


async def registered_nodes(redis: Redis, keys: Keys, cluster: str) -> list[str]:
    return sorted(text(m) for m in await redis.smembers(keys.registry(cluster)))


async def register(redis_url: str, namespace: str, cluster: str, nodes: Iterable[str]) -> int:
    """Enrol nodes with a short-lived connection (for the CLI, the fleet and tests)."""
    redis = connect_redis(redis_url)
    try:
        return await register_nodes(redis, Keys(namespace), cluster, nodes)
    finally:
        await redis.aclose()


# ---------------------------------------------------------------- a cluster's backend

BackendKind = Literal["local", "kubernetes"]
BACKEND_KINDS: tuple[BackendKind, ...] = ("local", "kubernetes")
CapacityKind = Literal["standby", "machinedeployment"]
CAPACITY_KINDS: tuple[CapacityKind, ...] = ("standby", "machinedeployment")


@dataclass(frozen=True)
class ClusterBackend:
    """What carries out a cluster's node steps (docs/kubernetes.md).

    `local`: the signed commands to ClusterWarden's own agents (the default, and the demo's).
    `kubernetes`: the cluster's API server, reached with `kubeconfig` (empty: the in-cluster
    service account), evicting at most `evictions_per_s` pods a second (bursts of
    `eviction_burst`): the cluster's eviction budget, explicit and per cluster. Its
    `add_capacity`/`remove_capacity` take nodes from its standby pool (`capacity` standby), or
    scale the pool's Cluster API MachineDeployment, named as the pool, in `capacity_namespace`
    (`capacity` machinedeployment). Work that names no pool (a pending pod selecting no
    `clusterwarden.io/pool`) waits for `default_pool`, the pool its agents report in.
    """

    kind: BackendKind = "local"
    kubeconfig: str = ""
    context: str = ""
    evictions_per_s: float = 5.0
    eviction_burst: int = 5
    capacity: CapacityKind = "standby"
    capacity_namespace: str = "default"
    default_pool: str = "default"

    def __post_init__(self) -> None:
        if self.kind not in BACKEND_KINDS:
            raise ValueError(f"unknown backend {self.kind!r}; expected one of {BACKEND_KINDS}")
        if self.capacity not in CAPACITY_KINDS:
            raise ValueError(f"unknown capacity {self.capacity!r}; expected one of "
                             f"{CAPACITY_KINDS}")
        if self.evictions_per_s <= 0 or self.eviction_burst < 1:
            raise ValueError("an eviction budget needs a positive rate and a burst of at least 1")
        if not self.default_pool:
            raise ValueError("a cluster's default pool needs a name")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str) -> ClusterBackend:
        data = json.loads(raw)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


LOCAL = ClusterBackend()


async def set_cluster_backend(redis: Redis, keys: Keys, cluster: str,
                              backend: ClusterBackend) -> None:
    async with redis.pipeline(transaction=True) as pipe:
        pipe.set(keys.cluster_backend(cluster), backend.to_json())
        if backend.kind == "local":
            pipe.srem(keys.backend_clusters(), cluster)
        else:
            pipe.sadd(keys.backend_clusters(), cluster)
        await pipe.execute()


async def backend_clusters(redis: Redis, keys: Keys) -> list[str]:
    """The clusters registered with a backend other than `local`."""
    return sorted(text(c) for c in await redis.smembers(keys.backend_clusters()))


async def cluster_backend(redis: Redis, keys: Keys, cluster: str) -> ClusterBackend:
    """The cluster's backend; one never named is `local`."""
    raw = await redis.get(keys.cluster_backend(cluster))
    return LOCAL if raw is None else ClusterBackend.from_json(text(raw))


async def name_backend(redis_url: str, namespace: str, cluster: str,
                       backend: ClusterBackend) -> None:
    """Name a cluster's backend with a short-lived connection (for the CLI and tests)."""
    redis = connect_redis(redis_url)
    try:
        await set_cluster_backend(redis, Keys(namespace), cluster, backend)
    finally:
        await redis.aclose()
