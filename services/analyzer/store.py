"""The analyzer's Redis adapter: consecutive-fault counts and open needs."""

from __future__ import annotations

from redis.asyncio import Redis

from services.shared.redis_client import Keys


class AnalyzerStore:
    """Small, idempotent facts the analyzer keeps between events."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def count_faulty(self, cluster: str, node: str, sample_id: str, faulty: bool) -> int:
        """Consecutive faulty samples of a node (a healthy one resets the run).

        Keyed by sample id so that a redelivered sample is not counted twice.
        """
        run_key = f"{self.keys.prefix}faultrun:{cluster}:{node}"
        seen_key = f"{self.keys.prefix}faultrun-seen:{cluster}:{node}"
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.get(seen_key)
            pipe.get(run_key)
            last_seen, run = await pipe.execute()
        if last_seen is not None and last_seen.decode() == sample_id:
            return int(run or 0)
        async with self.redis.pipeline(transaction=True) as pipe:
            if faulty:
                pipe.incr(run_key)
            else:
                pipe.set(run_key, 0)
            pipe.set(seen_key, sample_id)
            result = await pipe.execute()
        return int(result[0]) if faulty else 0

    async def open_need(self, cluster: str, kind: str, target: str, ttl_s: int) -> bool:
        """True if no need of this kind is open for `target` (and marks one open)."""
        key = self.keys.open_need(cluster, kind, target)
        return bool(await self.redis.set(key, b"1", nx=True, ex=ttl_s))
