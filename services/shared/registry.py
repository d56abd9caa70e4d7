"""Node enrolment: the collector uses only reports from nodes registered in their cluster."""

from __future__ import annotations

from collections.abc import Iterable

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
