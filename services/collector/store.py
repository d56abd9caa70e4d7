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
# per report (its node hash, its cluster's heartbeat schedule); ARGV holds 11 values per report.
# A redelivery of the last applied report answers 'replay' with the same previous state, so
# the caller republishes the same (deterministically identified) events after a crash.
APPLY_REPORTS = """
local out = {}
local n = (#KEYS - 1) / 2
for i = 0, n - 1 do
  local node, due, a = KEYS[2 + 2 * i], KEYS[3 + 2 * i], 11 * i
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
    redis.call('ZADD', due, ARGV[a + 11], ARGV[a + 8])
    redis.call('SADD', KEYS[1], ARGV[a + 10])
    out[#out + 1] = 'ok'
    out[#out + 1] = prev
  end
end
return out
"""

# Moves a silent node to `suspect` or `down`, only if no report arrived since the sweep read it.
# Moves a silent node to `suspect` or `down` and schedules its next check (ARGV[3], or ''
# for none), only if no report arrived since the sweep read it (a report reschedules itself).
# A node in a state the heartbeat does not track (offline) leaves the schedule.
MARK_SILENT = """
if redis.call('HGET', KEYS[1], 'last_report_at') ~= ARGV[1] then return false end
local state = redis.call('HGET', KEYS[1], 'state') or ''
local tracked = false
for i = 5, #ARGV do
  if state == ARGV[i] then tracked = true end
end
if (not tracked) or ARGV[3] == '' then
  redis.call('ZREM', KEYS[2], ARGV[4])
else
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
end
if (not tracked) or state == ARGV[2] then return false end
redis.call('HSET', KEYS[1], 'state', ARGV[2])
return state
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
        self, reports: list[tuple[NodeReport, NodeStateName, float]], suspect_after: float
    ) -> list[Applied]:
        """Apply (report, implied state, mean GPU util) triples in one atomic script call.

        Each report also schedules its node's next heartbeat check: `suspect_after` report
        intervals from now.
        """
        keys: list[str] = [self.keys.clusters()]
        args: list[str | int | float] = []
        for report, state, util in reports:
            keys += [self.keys.node(report.cluster_id, report.node_id),
                     self.keys.heartbeat_due(report.cluster_id)]
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
                f"{report.occurred_at.timestamp() + report.interval_s * suspect_after:.6f}",
            ]
        flat = await self._apply(keys=keys, args=args)
        return [
            Applied(text(flat[i]), cast(NodeStateName, text(flat[i + 1])) or None)
            for i in range(0, len(flat), 2)
        ]

    async def clusters(self) -> list[str]:
        return sorted(text(m) for m in await self.redis.smembers(self.keys.clusters()))

    async def due_nodes(self, cluster: str, now: datetime, limit: int) -> list[NodeRow]:
        """Nodes whose heartbeat check is due: only they are read, however large the fleet."""
        names = members(await self.redis.zrangebyscore(
            self.keys.heartbeat_due(cluster), "-inf", now.timestamp(), start=0, num=limit
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
        self, cluster: str, row: NodeRow, new_state: NodeStateName, next_check: float | None,
        from_states: frozenset[str],
    ) -> NodeStateName | None:
        """Set the state of a silent node; returns the previous state if it changed."""
        prev = await self._mark(
            keys=[self.keys.node(cluster, row.node_id), self.keys.heartbeat_due(cluster)],
            args=[row.last_report_at, new_state,
                  "" if next_check is None else f"{next_check:.6f}", row.node_id,
                  *sorted(from_states)],
        )
        return prev.decode() if prev else None

    async def try_lock_sweep(self, name: str, ttl_s: float) -> bool:
        """One sweep per tick across every collector instance."""
        return bool(
            await self.redis.set(self.keys.sweep_lock(name), b"1", nx=True, px=int(ttl_s * 1000))
        )


def epoch_to_datetime(text: str) -> datetime:
    return datetime.fromtimestamp(float(text), UTC)
