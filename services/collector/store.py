"""Node state in Redis: one hash per node, a last-seen index per cluster, atomic scripts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from redis.asyncio import Redis

from schemas.events.v1 import NodeReport, NodeStateName
from services.shared.redis_client import Keys, members, text

# Applies a batch of reports, each only if it is newer than the last one applied to its node
# (per-node sequence), in one atomic call: one script call per batch, not per report, keeps
# Redis's share of the 5,000 reports/s path small. KEYS[1] is the cluster set; then two keys
# per report (its node hash, its cluster's last-seen index); ARGV holds 10 values per report.
# A redelivery of the last applied report answers 'replay' with the same previous state, so
# the caller republishes the same (deterministically identified) events after a crash.
APPLY_REPORTS = """
local out = {}
local n = (#KEYS - 1) / 2
for i = 0, n - 1 do
  local node, seen, a = KEYS[2 + 2 * i], KEYS[3 + 2 * i], 10 * i
  local last_event = redis.call('HGET', node, 'last_event_id')
  if last_event == ARGV[a + 9] then
    out[#out + 1] = 'replay'
    out[#out + 1] = redis.call('HGET', node, 'prev_state') or ''
  elseif tonumber(ARGV[a + 1]) <= tonumber(redis.call('HGET', node, 'seq') or '-1') then
    out[#out + 1] = 'old'
    out[#out + 1] = ''
  else
    local prev = redis.call('HGET', node, 'state') or ''
    redis.call('HSET', node, 'seq', ARGV[a + 1], 'last_report_at', ARGV[a + 2],
      'state', ARGV[a + 3], 'pool', ARGV[a + 4], 'interval_s', ARGV[a + 5],
      'gpu_util', ARGV[a + 6], 'fault_count', ARGV[a + 7], 'node_id', ARGV[a + 8],
      'last_event_id', ARGV[a + 9], 'prev_state', prev)
    redis.call('ZADD', seen, ARGV[a + 2], ARGV[a + 8])
    redis.call('SADD', KEYS[1], ARGV[a + 10])
    out[#out + 1] = 'ok'
    out[#out + 1] = prev
  end
end
return out
"""

# Moves a silent node to `suspect` or `down`, only if no report arrived since the sweep read it.
MARK_SILENT = """
if redis.call('HGET', KEYS[1], 'last_report_at') ~= ARGV[1] then return false end
local state = redis.call('HGET', KEYS[1], 'state') or ''
if state == ARGV[2] then return false end
for i = 3, #ARGV do
  if state == ARGV[i] then
    redis.call('HSET', KEYS[1], 'state', ARGV[2])
    return state
  end
end
return false
"""


@dataclass(frozen=True)
class Applied:
    """What applying one report did: 'ok' | 'replay' | 'old', and the state before it."""

    outcome: str
    previous: NodeStateName | None


@dataclass(frozen=True)
class NodeRow:
    """A node as the heartbeat sweep sees it."""

    node_id: str
    pool: str
    state: str
    last_report_at: str
    interval_s: float


class NodeStore:
    """The collector's Redis adapter; calls for many nodes are pipelined."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._apply = redis.register_script(APPLY_REPORTS)
        self._mark = redis.register_script(MARK_SILENT)

    async def apply_reports(
        self, reports: list[tuple[NodeReport, NodeStateName, float]]
    ) -> list[Applied]:
        """Apply (report, implied state, mean GPU util) triples in one atomic script call."""
        keys: list[str] = [self.keys.clusters()]
        args: list[str | int | float] = []
        for report, state, util in reports:
            keys += [self.keys.node(report.cluster_id, report.node_id),
                     self.keys.last_seen(report.cluster_id)]
            args += [
                report.seq,
                f"{report.occurred_at.timestamp():.6f}",
                state,
                report.pool,
                report.interval_s,
                util,
                len(report.faults),
                report.node_id,
                str(report.event_id),
                report.cluster_id,
            ]
        flat = await self._apply(keys=keys, args=args)
        return [
            Applied(text(flat[i]), cast(NodeStateName, text(flat[i + 1])) or None)
            for i in range(0, len(flat), 2)
        ]

    async def clusters(self) -> list[str]:
        return sorted(text(m) for m in await self.redis.smembers(self.keys.clusters()))

    async def silent_nodes(self, cluster: str, older_than: datetime) -> list[NodeRow]:
        """Nodes whose last report is older than `older_than`."""
        names = members(await self.redis.zrangebyscore(
            self.keys.last_seen(cluster), "-inf", older_than.timestamp()
        ))
        if not names:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hmget(self.keys.node(cluster, name),
                           ["pool", "state", "last_report_at", "interval_s"])
            rows = await pipe.execute()
        return [
            NodeRow(name, pool.decode(), state.decode(), last.decode(), float(interval))
            for name, (pool, state, last, interval) in zip(names, rows, strict=True)
            if last is not None
        ]

    async def mark_silent(
        self, cluster: str, row: NodeRow, new_state: NodeStateName, from_states: frozenset[str]
    ) -> NodeStateName | None:
        """Set the state of a silent node; returns the previous state if it changed."""
        prev = await self._mark(
            keys=[self.keys.node(cluster, row.node_id)],
            args=[row.last_report_at, new_state, *sorted(from_states)],
        )
        return prev.decode() if prev else None

    async def try_lock_sweep(self, name: str, ttl_s: float) -> bool:
        """One sweep per tick across every collector instance."""
        return bool(
            await self.redis.set(self.keys.sweep_lock(name), b"1", nx=True, px=int(ttl_s * 1000))
        )


def epoch_to_datetime(text: str) -> datetime:
    return datetime.fromtimestamp(float(text), UTC)
