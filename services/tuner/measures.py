"""The tuner's measures in Redis: per pool, per node type, a decayed throughput per node.

One hash per pool (`Keys.tuning`), one field per node type, each updated by a script so that
several tuner instances reading the samples topic never lose an update. A redelivered batch
counts twice, which a decayed average absorbs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from redis.asyncio import Redis

from common.clock import EpochClock
from schemas.events.v1 import Sample
from services.shared.redis_client import Keys, text
from services.tuner.policy import Measure

# KEYS[1] the pool's hash, KEYS[2] the set of measured pools. ARGV[1] node type, ARGV[2] the
# sample's throughput, ARGV[3] its GPUs, ARGV[4] alpha, ARGV[5] now, ARGV[6] the pool member.
_RECORD = """
local v = tonumber(ARGV[2])
local g = tonumber(ARGV[3])
local a = tonumber(ARGV[4])
local n = 1
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local d = cjson.decode(cur)
  v = d.throughput + a * (v - d.throughput)
  g = d.gpus + a * (g - d.gpus)
  n = d.samples + 1
end
redis.call('HSET', KEYS[1], ARGV[1],
  cjson.encode({throughput = v, gpus = g, samples = n, at = tonumber(ARGV[5])}))
redis.call('SADD', KEYS[2], ARGV[6])
return n
"""


def counts(sample: Sample) -> bool:
    """A sample says what a node can deliver only while it works: an active node with
    throughput from running jobs (an idle node's zero is load, not capability)."""
    return sample.mode == "active" and sample.job_throughput > 0 and sample.fault_count == 0


class Measures:
    """Records samples into the decayed measures and reads them back."""

    def __init__(self, redis: Redis, keys: Keys, alpha: float, clock: EpochClock) -> None:
        self.redis = redis
        self.keys = keys
        self.alpha = alpha
        self.clock = clock
        self._record = redis.register_script(_RECORD)

    async def record(self, samples: Iterable[Sample]) -> int:
        """Fold the samples that count into the measures; how many counted."""
        counted = [s for s in samples if counts(s)]
        if not counted:
            return 0
        now = self.clock()
        async with self.redis.pipeline(transaction=False) as pipe:
            for s in counted:
                await self._record(
                    keys=[self.keys.tuning(s.cluster_id, s.pool), self.keys.tuning_pools()],
                    args=[s.node_type, s.job_throughput, s.gpu_count, self.alpha, now,
                          f"{s.cluster_id}:{s.pool}"], client=pipe)
            await pipe.execute()
        return len(counted)

    async def all(self) -> list[Measure]:
        """Every pool's measures, by cluster, pool and node type."""
        found: list[Measure] = []
        for member in sorted(text(m) for m in await self.redis.smembers(self.keys.tuning_pools())):
            cluster, _, pool = member.partition(":")
            fields = await self.redis.hgetall(self.keys.tuning(cluster, pool))
            for node_type, raw in sorted((text(k), text(v)) for k, v in fields.items()):
                data = json.loads(raw)
                found.append(Measure(cluster=cluster, pool=pool, node_type=node_type,
                                     throughput_per_node=float(data["throughput"]),
                                     gpus_per_node=float(data["gpus"]),
                                     samples=int(data["samples"]), at=float(data["at"])))
        return found
