"""The analyzer's Redis adapter: consecutive-fault runs and open needs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from redis.asyncio import Redis

from common.clock import epoch_ms
from schemas.events.v1 import OpsNeed, Sample
from schemas.topics import Topic
from services.analyzer.conditions import ConditionState
from services.analyzer.observation import NodeLoad, PoolObservation, PoolSpread
from services.shared.demand import OPS_TASKS, parse_entries, total
from services.shared.outbox import OUTBOX_LUA, Outbox, record
from services.shared.redis_client import Keys, members, text

OUTBOX_OWNER = "analyzer"

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


# Records fatal fault episodes per GPU and counts those within the repeat window.
# KEYS: one sorted set per (node, GPU); ARGV[1] window start, ARGV[2] now, ARGV[3] TTL,
# then per key: episode id, '1' if the episode starts now (record it).
FATAL_EPISODES = """
local out = {}
for i = 1, #KEYS do
  if ARGV[3 + 2 * i] == '1' then
    redis.call('ZADD', KEYS[i], ARGV[2], ARGV[2 + 2 * i])
    redis.call('EXPIRE', KEYS[i], ARGV[3])
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', ARGV[1])
  out[i] = redis.call('ZCARD', KEYS[i])
end
return out
"""


@dataclass(frozen=True)
class FatalEpisode:
    """One GPU's run of faulty reports with a fatal fault, named by the report that began it."""

    cluster: str
    node: str
    gpu: int
    episode_id: str
    starts_now: bool  # this report began the run, so the episode is recorded now


# Marks needs open (KEYS[3..], ARGV[1] their TTL) and writes each one that was not open yet to
# the outbox (KEYS[1..2]) under its id: ARGV[2] now (epoch ms), then id, record per need.
# Returns 1 per need opened now, 0 per need already open.
OPEN_NEEDS = OUTBOX_LUA + """
local out = {}
for i = 3, #KEYS do
  local n = i - 2
  if redis.call('SET', KEYS[i], '1', 'NX', 'EX', tonumber(ARGV[1])) then
    outbox_append(KEYS[1], KEYS[2], ARGV[1 + 2 * n], ARGV[2], ARGV[2 + 2 * n])
    out[n] = 1
  else
    out[n] = 0
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
        self.outbox = Outbox(redis, keys, OUTBOX_OWNER)
        self._open = redis.register_script(OPEN_NEEDS)
        self._runs = redis.register_script(FAULT_RUNS)
        self._episodes = redis.register_script(FATAL_EPISODES)

    async def fault_runs(self, samples: list[Sample], faulty: list[bool]) -> list[int]:
        """Consecutive faulty samples of each sample's node, counting that sample."""
        if not samples:
            return []
        keys = [self.keys.fault_run(s.cluster_id, s.node_id) for s in samples]
        args: list[str | int] = []
        for s, bad in zip(samples, faulty, strict=True):
            args += [str(s.event_id), 1 if bad else 0]
        args.append(self.run_ttl_s)
        return [int(v) for v in await self._runs(keys=keys, args=args)]

    async def fatal_episodes(self, items: list[FatalEpisode], now: float,
                             window_s: float) -> list[int]:
        """Per episode: the fatal episodes of its GPU in the window, itself included.

        An episode is a run of consecutive faulty reports, recorded once when it starts, so
        a fault repeated in every report (or replayed) counts once.
        """
        if not items:
            return []
        keys = [self.keys.gpu_fatal(e.cluster, e.node, e.gpu) for e in items]
        args: list[str | float | int] = [now - window_s, now, int(window_s) + 60]
        for e in items:
            args += [e.episode_id, 1 if e.starts_now else 0]
        return [int(v) for v in await self._episodes(keys=keys, args=args)]

    async def open_needs(self, needs: list[OpsNeed], ttl_s: int, now: datetime,
                         traces: Sequence[str] | None = None) -> list[OpsNeed]:
        """The needs of which none of the same kind was open for their target; each is marked
        open and written to the outbox in the same call, so a crash before it is published
        leaves it for the relay instead of losing it while the mark blocks its raising again.
        `traces`: each need's packed trace context, kept with it in the outbox (by default
        the current span's)."""
        if not needs:
            return []
        keys = [*self.outbox.script_keys,
                *(self.keys.open_need(n.cluster_id, n.kind, n.target) for n in needs)]
        args: list[str | int] = [ttl_s, epoch_ms(now)]
        packed: Sequence[str | None] = traces if traces is not None else [None] * len(needs)
        for need, trace_context in zip(needs, packed, strict=True):
            args += [str(need.event_id), record(Topic.OPS_NEEDS, need, trace_context)]
        opened = await self._open(keys=keys, args=args)
        return [need for need, fresh in zip(needs, opened, strict=True) if int(fresh)]


# Downsamples a series into several resolutions: for each (seconds, length) pair, values in
# the same bucket are averaged, and when a bucket ends its mean is pushed onto that
# resolution's list (newest first, trimmed to length). KEYS[1] is the series' working hash;
# ARGV[1] its list prefix, ARGV[2] the time (epoch s), ARGV[3] the value, then the pairs.
DOWNSAMPLE = """
local now, value = tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 4, #ARGV, 2 do
  local res, len = ARGV[i], tonumber(ARGV[i + 1])
  local bucket = math.floor(now / tonumber(res))
  local state = redis.call('HMGET', KEYS[1], res .. ':b', res .. ':s', res .. ':n')
  if state[1] and tonumber(state[1]) == bucket then
    redis.call('HSET', KEYS[1], res .. ':s', tonumber(state[2]) + value,
      res .. ':n', tonumber(state[3]) + 1)
  else
    if state[1] then
      local list = ARGV[1] .. res
      local mean = tonumber(state[2]) / tonumber(state[3])
      redis.call('LPUSH', list, state[1] * tonumber(res) .. ':' .. string.format('%.3f', mean))
      redis.call('LTRIM', list, 0, len - 1)
    end
    redis.call('HSET', KEYS[1], res .. ':b', bucket, res .. ':s', value, res .. ':n', 1)
  end
end
return 1
"""

# Pool utilisation history kept for the forecast and the capacity plan: 10 s for a day,
# 1 min for a week, 1 h for a year, 1 day for three years.
POOL_HISTORY: tuple[tuple[int, int], ...] = (
    (10, 8_640), (60, 10_080), (3_600, 8_760), (86_400, 1_096))


class PoolStore:
    """Pool aggregates (kept by the collector), condition states and utilisation history."""

    def __init__(self, redis: Redis, keys: Keys, storage_weight: float = 0.0) -> None:
        self.redis = redis
        self.keys = keys
        self.storage_weight = storage_weight
        self._downsample = redis.register_script(DOWNSAMPLE)

    async def observe_pools(self, now: datetime) -> list[PoolObservation]:
        """Every pool of every cluster, from the collector's aggregates and queued demand."""
        pools = await self.pool_names()
        if not pools:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for cluster, pool in pools:
                pipe.hgetall(self.keys.pool(cluster, pool))
                pipe.get(self.keys.demand(cluster, pool))
            rows = await pipe.execute()
        observations = []
        for (cluster, pool), aggregate, demand in zip(pools, rows[::2], rows[1::2], strict=True):
            fields = {text(k): text(v) for k, v in aggregate.items()}
            by_state = {
                name: max(0, int(fields.get(f"n_{name}", "0")))
                for name in ("up", "suspect", "down", "draining", "offline")
            }
            util_n = int(fields.get("util_n", "0"))
            util = float(fields.get("util_sum", "0")) / util_n if util_n > 0 else 0.0
            gpus_up = max(0, int(fields.get("gpu_n", "0")))
            disk = float(fields.get("disk_sum", "0")) / util_n if util_n > 0 else 0.0
            observations.append(PoolObservation(
                cluster_id=cluster, pool=pool,
                nodes_by_state={k: v for k, v in by_state.items() if v},  # type: ignore[misc]
                gpu_utilization_pct=round(min(max(util, 0.0), 100.0), 3),
                demand_pct=float(text(demand)) if demand is not None else 0.0,
                gpus_up=gpus_up, storage_pct=round(min(max(disk, 0.0), 100.0), 3),
                storage_weight=self.storage_weight, observed_at=now,
            ))
        return observations

    async def pool_names(self) -> list[tuple[str, str]]:
        """(cluster, pool) of every pool the collector knows, sorted."""
        clusters = sorted(text(c) for c in await self.redis.smembers(self.keys.clusters()))
        pools: list[tuple[str, str]] = []
        for cluster in clusters:
            names = await self.redis.smembers(self.keys.pools(cluster))
            pools += [(cluster, text(p)) for p in sorted(names, key=text)]
        return pools

    async def with_demand(self, observations: list[PoolObservation],
                          now: datetime) -> list[PoolObservation]:
        """The pools with their queued demand from every source, added up now; the share of
        each pool's up GPUs is written to `Keys.demand` for the executor and the console."""
        if not observations:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for obs in observations:
                pipe.hgetall(self.keys.demand_sources(obs.cluster_id, obs.pool))
            rows = await pipe.execute()
        ops = await self.queued_ops()
        out = []
        async with self.redis.pipeline(transaction=False) as pipe:
            for obs, raw in zip(observations, rows, strict=True):
                queued = ops.get((obs.cluster_id, obs.pool), 0)
                demand = total(parse_entries(raw), now.timestamp(),
                               [(OPS_TASKS, queued, 0.0)] if queued else [])
                pct = round(demand.pct_of(obs.gpus_up), 3)
                pipe.set(self.keys.demand(obs.cluster_id, obs.pool), f"{pct}", ex=86_400)
                out.append(obs.model_copy(update={
                    "demand_pct": pct, "queued_items": demand.items,
                    "queued_detail": demand.describe()}))
            await pipe.execute()
        return out

    async def queued_ops(self, limit: int = 1_000) -> dict[tuple[str, str], int]:
        """Ops tasks queued and not yet dispatched, per (cluster, pool), from the scheduler's
        queue (its most urgent `limit`)."""
        ids = members(await self.redis.zrange(self.keys.queue_ready(), 0, limit - 1))
        if not ids:
            return {}
        counts: dict[tuple[str, str], int] = {}
        for raw in await self.redis.hmget(self.keys.queue_items(), ids):
            if raw is None:
                continue
            task = json.loads(raw)
            key = (str(task.get("cluster_id", "")), str(task.get("pool", "default")))
            counts[key] = counts.get(key, 0) + 1
        return counts

    async def spreads(self, pools: list[tuple[str, str]]) -> dict[tuple[str, str], PoolSpread]:
        """Each pool's two least loaded up nodes and two busiest with a movable job, from
        the collector's pool indexes: one round trip for every pool of a batch."""
        if not pools:
            return {}
        async with self.redis.pipeline(transaction=False) as pipe:
            for cluster, pool in pools:
                pipe.zrange(self.keys.pool_nodes(cluster, pool), 0, 1, withscores=True)
                pipe.zrevrange(self.keys.pool_movable(cluster, pool), 0, 1, withscores=True)
            rows = await pipe.execute()

        def loads(row: list[tuple[bytes, float]]) -> tuple[NodeLoad, ...]:
            return tuple(NodeLoad(node_id=text(n), load_pct=float(v)) for n, v in row)

        return {key: PoolSpread(lowest=loads(low), busiest_movable=loads(busy))
                for key, low, busy in zip(pools, rows[::2], rows[1::2], strict=True)}

    async def load_conditions(self, keys: list[str]) -> list[ConditionState | None]:
        if not keys:
            return []
        values = await self.redis.mget(keys)
        return [ConditionState.model_validate_json(v) if v else None for v in values]

    async def save_conditions(self, items: list[tuple[str, ConditionState | None]],
                              ttl_s: int = 86_400) -> None:
        """Write changed condition states (None: the condition ended)."""
        if not items:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for key, state in items:
                if state is None:
                    pipe.delete(key)
                else:
                    pipe.set(key, state.model_dump_json(), ex=ttl_s)
            await pipe.execute()

    async def record_utilization(self, pool: PoolObservation) -> None:
        """Extend the pool's downsampled utilisation history."""
        prefix = self.keys.pool_history_prefix(pool.cluster_id, pool.pool)
        args: list[str | float | int] = [prefix, pool.observed_at.timestamp(),
                                         pool.effective_utilization_pct]
        for resolution, length in POOL_HISTORY:
            args += [resolution, length]
        await self._downsample(keys=[self.keys.pool_history_work(pool.cluster_id, pool.pool)],
                               args=args)

    async def try_lock_tick(self, name: str, ttl_s: float) -> bool:
        """One pool analysis per period across every analyzer instance."""
        return bool(
            await self.redis.set(self.keys.sweep_lock(name), b"1", nx=True, px=int(ttl_s * 1000))
        )
