"""Node records in Redis that more than the collector changes.

The collector keeps one hash per node, its schedules, its pool's aggregate and member index,
and its history (`services/collector/store.py`). When a node leaves the cluster for good (a
standby node the capacity provider released), its records must go with it; the capacity
provider does that through this module, so it does not depend on the collector.
"""

from __future__ import annotations

from typing import cast

from redis.asyncio import Redis

from schemas.events.v1 import NodeStateName
from services.shared.redis_client import Keys, text

# Forgets a node that left the cluster for good (a standby node the capacity provider
# released): its state leaves the pool's aggregate and member index, its schedules and its
# history go, so a node that no longer exists is not counted as down for ever; its advertised
# peer-probe address goes too, so no peer is assigned to probe it. KEYS: node hash, heartbeat
# schedule, probe schedule, history, peer addresses; ARGV: key prefix, cluster, node id.
# Answers the state the node had ('' if none was known).
FORGET_NODE = """
redis.call('ZREM', KEYS[2], ARGV[3])
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('DEL', KEYS[4])
redis.call('HDEL', KEYS[5], ARGV[3])
local f = redis.call('HMGET', KEYS[1], 'state', 'pool', 'gpu_util', 'gpus', 'disk_pct')
if not f[1] then
  redis.call('DEL', KEYS[1])
  return ''
end
local agg = ARGV[1] .. 'pool:' .. ARGV[2] .. ':' .. f[2]
redis.call('HINCRBY', agg, 'n_' .. f[1], -1)
if f[1] == 'up' then
  redis.call('HINCRBYFLOAT', agg, 'util_sum', -tonumber(f[3]))
  redis.call('HINCRBY', agg, 'util_n', -1)
  redis.call('HINCRBY', agg, 'gpu_n', -tonumber(f[4] or '0'))
  redis.call('HINCRBYFLOAT', agg, 'disk_sum', -tonumber(f[5] or '0'))
  redis.call('ZREM', ARGV[1] .. 'pool-nodes:' .. ARGV[2] .. ':' .. f[2], ARGV[3])
  redis.call('ZREM', ARGV[1] .. 'pool-movable:' .. ARGV[2] .. ':' .. f[2], ARGV[3])
end
redis.call('DEL', KEYS[1])
return f[1]
"""


class NodeRecords:
    """What may change a node's records besides the collector: forgetting the node."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.keys = keys
        self._forget = redis.register_script(FORGET_NODE)

    async def forget(self, cluster: str, node: str) -> NodeStateName | None:
        """Drop a node that left the cluster for good; returns the state it had, if any."""
        state = text(await self._forget(
            keys=[self.keys.node(cluster, node), self.keys.heartbeat_due(cluster),
                  self.keys.probe_due(cluster), self.keys.history(cluster, node),
                  self.keys.peer_addresses(cluster)],
            args=[self.keys.prefix, cluster, node],
        ))
        return cast(NodeStateName, state) if state else None
