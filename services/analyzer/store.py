"""The analyzer's Redis adapter: consecutive-fault runs and open needs."""

from __future__ import annotations

from redis.asyncio import Redis

from schemas.events.v1 import Sample
from services.shared.redis_client import Keys

# Updates the consecutive-fault run of every node in a batch in one atomic call, and returns
# the runs. A sample already counted (redelivery) returns the run without counting it again.
# A healthy sample resets a run, and costs nothing for a node that never had one.
FAULT_RUNS = """
local out = {}
for i = 1, #KEYS do
  local id, faulty = ARGV[2 * i - 1], ARGV[2 * i]
  if faulty == '1' then
    if redis.call('HGET', KEYS[i], 'last') == id then
      out[i] = tonumber(redis.call('HGET', KEYS[i], 'run'))
    else
      out[i] = redis.call('HINCRBY', KEYS[i], 'run', 1)
      redis.call('HSET', KEYS[i], 'last', id)
      redis.call('EXPIRE', KEYS[i], ARGV[#ARGV])
    end
  else
    redis.call('DEL', KEYS[i])
    out[i] = 0
  end
end
return out
"""


class AnalyzerStore:
    """Small, idempotent facts the analyzer keeps between events."""

    def __init__(self, redis: Redis, keys: Keys, run_ttl_s: int = 86_400) -> None:
        self.redis = redis
        self.keys = keys
        self.run_ttl_s = run_ttl_s
        self._runs = redis.register_script(FAULT_RUNS)

    async def fault_runs(self, samples: list[Sample]) -> list[int]:
        """Consecutive faulty samples of each sample's node, counting that sample."""
        if not samples:
            return []
        keys = [f"{self.keys.prefix}faultrun:{s.cluster_id}:{s.node_id}" for s in samples]
        args: list[str | int] = []
        for s in samples:
            args += [str(s.event_id), 1 if s.fault_count > 0 else 0]
        args.append(self.run_ttl_s)
        return [int(v) for v in await self._runs(keys=keys, args=args)]

    async def open_need(self, cluster: str, kind: str, target: str, ttl_s: int) -> bool:
        """True if no need of this kind is open for `target` (and marks one open)."""
        key = self.keys.open_need(cluster, kind, target)
        return bool(await self.redis.set(key, b"1", nx=True, ex=ttl_s))
