"""Node state in Redis: one hash per node, a last-seen index per cluster, atomic scripts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from redis.asyncio import Redis

from common.clock import epoch_ms
from schemas.events.v1 import NodeReport, NodeState, NodeStateName
from schemas.topics import Topic
from services.shared.nodes import NodeRecords
from services.shared.outbox import OUTBOX_LUA, Outbox, record
from services.shared.redis_client import Keys, members, text

OUTBOX_OWNER = "collector"

# Applies a batch of reports in one atomic call (one script call per batch, not per report,
# keeps Redis's share of the 5,000 reports/s path small). For each report, in order:
#  * a node that is not registered answers 'unknown' (quarantined: no auto-registration);
#  * a redelivery of the last applied report answers 'replay' with the same previous state,
#    so the caller republishes the same (deterministically identified) events after a crash;
#  * a report not newer than the last applied one (per-node sequence) answers 'old';
#  * otherwise the node hash is updated (with the node's mode, GPU count and a compact list of
#    its jobs, which the centre plans migrations and capacity from), its next heartbeat check
#    scheduled, the pool's aggregate (nodes per state, utilisation sum, GPUs and storage use
#    sum of the up nodes) moved
#    from the old state to the new, the pool's member index (pool-nodes: up node -> its
#    utilisation) kept so that a node is a member exactly while its state is up (and the
#    index of its up nodes with work that could move, pool-movable, likewise), and the
#    node's per-minute utilisation history extended when a minute ends; a report carrying a
#    fault also sets `fault_at` (its time), from which an online step's health check holds.
# KEYS[1] is the cluster set; then two keys per report (node hash, heartbeat schedule).
# ARGV[1] is the key prefix (aggregate, registry, pool-nodes and history keys are derived from
# it, which needs a single Redis or hash-tagged keys), ARGV[2] '1' if registration is
# required, ARGV[3] the history length in minutes, ARGV[4] the probe period (a node's first
# report schedules its first centre probe); then 17 values per report. Each report answers
# three values: outcome, previous state, and the node's count of consecutive failed probes.
APPLY_REPORTS = """
local P, require_registered, history_len = ARGV[1], ARGV[2] == '1', tonumber(ARGV[3])
local probe_period = tonumber(ARGV[4])
local out = {}
local n = (#KEYS - 1) / 2
for i = 0, n - 1 do
  local node, due, a = KEYS[2 + 2 * i], KEYS[3 + 2 * i], 4 + 17 * i
  local cluster, node_id, pool = ARGV[a + 10], ARGV[a + 8], ARGV[a + 4]
  if require_registered and redis.call('SISMEMBER', P .. 'registry:' .. cluster, node_id) == 0
  then
    out[#out + 1] = 'unknown'
    out[#out + 1] = ''
    out[#out + 1] = 0
  elseif redis.call('HGET', node, 'last_event_id') == ARGV[a + 9] then
    out[#out + 1] = 'replay'
    out[#out + 1] = redis.call('HGET', node, 'prev_state') or ''
    out[#out + 1] = tonumber(redis.call('HGET', node, 'probe_failures') or '0')
  elseif tonumber(ARGV[a + 1]) <= tonumber(redis.call('HGET', node, 'seq') or '-1') then
    out[#out + 1] = 'old'
    out[#out + 1] = ''
    out[#out + 1] = 0
  else
    local old = redis.call('HMGET', node, 'state', 'gpu_util', 'pool', 'minute', 'minute_sum',
      'minute_n', 'gpus', 'disk_pct')
    local prev, state, util = old[1] or '', ARGV[a + 3], tonumber(ARGV[a + 6])
    if prev ~= '' then
      local agg = P .. 'pool:' .. cluster .. ':' .. old[3]
      redis.call('HINCRBY', agg, 'n_' .. prev, -1)
      if prev == 'up' then
        redis.call('HINCRBYFLOAT', agg, 'util_sum', -tonumber(old[2]))
        redis.call('HINCRBY', agg, 'util_n', -1)
        redis.call('HINCRBY', agg, 'gpu_n', -tonumber(old[7] or '0'))
        redis.call('HINCRBYFLOAT', agg, 'disk_sum', -tonumber(old[8] or '0'))
      end
    end
    local agg = P .. 'pool:' .. cluster .. ':' .. pool
    redis.call('HINCRBY', agg, 'n_' .. state, 1)
    local members = P .. 'pool-nodes:' .. cluster .. ':'
    local movable = P .. 'pool-movable:' .. cluster .. ':'
    if prev == 'up' and (state ~= 'up' or old[3] ~= pool) then
      redis.call('ZREM', members .. old[3], node_id)
      redis.call('ZREM', movable .. old[3], node_id)
    end
    if state == 'up' then
      redis.call('HINCRBYFLOAT', agg, 'util_sum', util)
      redis.call('HINCRBY', agg, 'util_n', 1)
      redis.call('HINCRBY', agg, 'gpu_n', tonumber(ARGV[a + 13]))
      redis.call('HINCRBYFLOAT', agg, 'disk_sum', tonumber(ARGV[a + 17]))
      redis.call('ZADD', members .. pool, util, node_id)
      if tonumber(ARGV[a + 16]) > 0 then
        redis.call('ZADD', movable .. pool, util, node_id)
      else
        redis.call('ZREM', movable .. pool, node_id)
      end
    end
    redis.call('SADD', P .. 'pools:' .. cluster, pool)
    local minute = math.floor(tonumber(ARGV[a + 2]) / 60)
    local msum, mn = util, 1
    if old[4] and tonumber(old[4]) == minute then
      msum, mn = tonumber(old[5]) + util, tonumber(old[6]) + 1
    elseif old[4] then
      local hist = P .. 'history:' .. cluster .. ':' .. node_id
      redis.call('LPUSH', hist, old[4] .. ':' .. string.format('%.2f', old[5] / old[6]))
      redis.call('LTRIM', hist, 0, history_len - 1)
    end
    redis.call('HSET', node, 'seq', ARGV[a + 1], 'last_report_at', ARGV[a + 2],
      'state', state, 'pool', pool, 'interval_s', ARGV[a + 5],
      'gpu_util', ARGV[a + 6], 'fault_count', ARGV[a + 7], 'node_id', node_id,
      'last_event_id', ARGV[a + 9], 'prev_state', prev,
      'minute', minute, 'minute_sum', msum, 'minute_n', mn,
      'mode', ARGV[a + 12], 'gpus', ARGV[a + 13], 'jobs', ARGV[a + 14],
      'job_count', ARGV[a + 15], 'disk_pct', ARGV[a + 17])
    if tonumber(ARGV[a + 7]) > 0 then
      redis.call('HSET', node, 'fault_at', ARGV[a + 2])
    end
    redis.call('ZADD', due, ARGV[a + 11], node_id)
    redis.call('ZADD', P .. 'probe-due:' .. cluster, 'NX', tonumber(ARGV[a + 2]) + probe_period,
      node_id)
    redis.call('SADD', KEYS[1], cluster)
    out[#out + 1] = 'ok'
    out[#out + 1] = prev
    out[#out + 1] = tonumber(redis.call('HGET', node, 'probe_failures') or '0')
  end
end
return out
"""

# Moves a silent node to `suspect` or `down` and schedules its next check (ARGV[3], or ''
# for none), only if no report arrived since the sweep read it (a report reschedules itself),
# moving it between states in its pool's aggregate (KEYS[3]) too, and out of the pool's up
# members (KEYS[4]) and up members with movable work (KEYS[5]) when it leaves up. A node in
# a state the heartbeat does not track (offline) leaves the schedule. The state change
# announces itself through the outbox (KEYS[6..7]): ARGV[5] now (epoch ms), ARGV[6] the
# event id, then per tracked state the event as it reads if the node was in that state.
MARK_SILENT = OUTBOX_LUA + """
if redis.call('HGET', KEYS[1], 'last_report_at') ~= ARGV[1] then return false end
local state = redis.call('HGET', KEYS[1], 'state') or ''
local announce = nil
for i = 7, #ARGV, 2 do
  if state == ARGV[i] then announce = ARGV[i + 1] end
end
if (not announce) or ARGV[3] == '' then
  redis.call('ZREM', KEYS[2], ARGV[4])
else
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
end
if (not announce) or state == ARGV[2] then return false end
redis.call('HSET', KEYS[1], 'state', ARGV[2])
redis.call('HINCRBY', KEYS[3], 'n_' .. state, -1)
redis.call('HINCRBY', KEYS[3], 'n_' .. ARGV[2], 1)
if state == 'up' then
  local util = tonumber(redis.call('HGET', KEYS[1], 'gpu_util'))
  redis.call('HINCRBYFLOAT', KEYS[3], 'util_sum', -util)
  redis.call('HINCRBY', KEYS[3], 'util_n', -1)
  redis.call('HINCRBY', KEYS[3], 'gpu_n', -tonumber(redis.call('HGET', KEYS[1], 'gpus') or '0'))
  redis.call('HINCRBYFLOAT', KEYS[3], 'disk_sum',
    -tonumber(redis.call('HGET', KEYS[1], 'disk_pct') or '0'))
  redis.call('ZREM', KEYS[4], ARGV[4])
  redis.call('ZREM', KEYS[5], ARGV[4])
end
outbox_append(KEYS[6], KEYS[7], ARGV[6], ARGV[5], announce)
return state
"""

# A node's jobs as the node hash keeps them: "job_id:kind:state" joined by commas (job ids
# are identifiers, so neither separator can occur in one). Bounded, so a node reporting a
# thousand jobs does not grow every report's write; `job_count` keeps the true number.
JOBS_LISTED = 64


def compact_jobs(report: NodeReport) -> str:
    """A report's jobs in the node hash's compact form (at most JOBS_LISTED of them)."""
    return ",".join(f"{j.job_id}:{j.kind}:{j.state}" for j in report.jobs[:JOBS_LISTED])


@dataclass(frozen=True)
class Applied:
    """What applying one report did: 'ok' | 'replay' | 'old' | 'unknown', the state before."""

    outcome: str
    previous: NodeStateName | None
    failed_probes: int = 0


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

    def __init__(self, redis: Redis, keys: Keys, require_registration: bool = True,
                 history_minutes: int = 1_440, probe_period_s: float = 60.0) -> None:
        self.redis = redis
        self.keys = keys
        self.probe_period_s = probe_period_s
        self.require_registration = require_registration
        self.history_minutes = history_minutes
        self._apply = redis.register_script(APPLY_REPORTS)
        self._mark = redis.register_script(MARK_SILENT)
        self.outbox = Outbox(redis, keys, OUTBOX_OWNER)
        self._records = NodeRecords(redis, keys)

    async def apply_reports(
        self, reports: list[tuple[NodeReport, NodeStateName, float]], suspect_after: float
    ) -> list[Applied]:
        """Apply (report, implied state, mean GPU util) triples in one atomic script call.

        Each report also schedules its node's next heartbeat check: `suspect_after` report
        intervals from now.
        """
        keys: list[str] = [self.keys.clusters()]
        args: list[str | int | float] = [self.keys.prefix, 1 if self.require_registration else 0,
                                         self.history_minutes, self.probe_period_s]
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
                report.mode,
                len(report.gpus),
                compact_jobs(report),
                len(report.jobs),
                sum(1 for job in report.jobs if job.movable),
                report.host.disk_used_pct,
            ]
        flat = await self._apply(keys=keys, args=args)
        return [
            Applied(text(flat[i]), cast(NodeStateName, text(flat[i + 1])) or None,
                    int(flat[i + 2]))
            for i in range(0, len(flat), 3)
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
        announcements: dict[str, NodeState], now: datetime,
    ) -> NodeState | None:
        """Set the state of a silent node; returns the event that announces the change, if
        it changed: the one of `announcements` (tracked state before -> event) for the state
        it left, which the same call wrote to the outbox. A state not in `announcements` is
        not the heartbeat's to change."""
        ids = {str(event.event_id) for event in announcements.values()}
        if len(ids) != 1:
            raise ValueError(f"one state change is one event, not {sorted(ids)}")
        args: list[str | int] = [
            row.last_report_at, new_state, "" if next_check is None else f"{next_check:.6f}",
            row.node_id, epoch_ms(now), ids.pop()]
        for before, event in sorted(announcements.items()):
            args += [before, record(Topic.OPS_NODE_STATE, event)]
        prev = await self._mark(
            keys=[self.keys.node(cluster, row.node_id), self.keys.heartbeat_due(cluster),
                  self.keys.pool(cluster, row.pool), self.keys.pool_nodes(cluster, row.pool),
                  self.keys.pool_movable(cluster, row.pool), *self.outbox.script_keys],
            args=args,
        )
        return announcements[text(prev)] if prev else None

    async def forget(self, cluster: str, node: str) -> NodeStateName | None:
        """Drop a node that left the cluster for good; returns the state it had, if any."""
        return await self._records.forget(cluster, node)

    async def try_lock_sweep(self, name: str, ttl_s: float) -> bool:
        """One sweep per tick across every collector instance."""
        return bool(
            await self.redis.set(self.keys.sweep_lock(name), b"1", nx=True, px=int(ttl_s * 1000))
        )


    async def first_alert(self, dedup_key: str, ttl_s: float) -> bool:
        """True for the first caller in `ttl_s` (every collector instance): raise the alert."""
        return bool(await self.redis.set(self.keys.alert_raised(dedup_key), b"1", nx=True,
                                         px=int(ttl_s * 1000)))


def epoch_to_datetime(text: str) -> datetime:
    return datetime.fromtimestamp(float(text), UTC)


# Claims the probes that are due for a cluster: returns their node ids and reschedules each
# one period later, atomically, so two collector instances never probe the same node twice.
CLAIM_PROBES = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
for _, id in ipairs(ids) do
  redis.call('ZADD', KEYS[1], tonumber(ARGV[1]) + tonumber(ARGV[2]), id)
end
return ids
"""

# Ends a probe. An answer (ARGV[1] == 'ok') resets the node's failed-probe count; expiry adds
# one (unless the node is silent already) and keeps the probe among the "late" ones for ten
# minutes. An answer is judged by when
# the node sent it (ARGV[5]), not by when the centre read it: one sent before the deadline
# but read after it (the centre was behind) still resets the count, so a slow centre does
# not make healthy nodes look dead. KEYS: pending (id -> deadline), targets (id -> node),
# late (id -> "node|deadline"), late index (id -> expiry time). An answer from another node
# than the probed one (ARGV[6], "cluster:node"; '' unchecked) changes nothing: {target, -1}.
END_PROBE = """
local target = redis.call('HGET', KEYS[2], ARGV[2])
if target and ARGV[1] == 'ok' and ARGV[6] ~= '' and ARGV[6] ~= target then
  return {target, -1}
end
if target then
  local deadline = redis.call('ZSCORE', KEYS[1], ARGV[2])
  redis.call('HDEL', KEYS[2], ARGV[2])
  redis.call('ZREM', KEYS[1], ARGV[2])
  local node = ARGV[3] .. target
  if ARGV[1] == 'ok' then
    redis.call('HSET', node, 'probe_failures', 0, 'probe_ok_at', ARGV[4])
    return {target, 0}
  end
  redis.call('HSET', KEYS[3], ARGV[2], target .. '|' .. (deadline or ARGV[4]))
  redis.call('ZADD', KEYS[4], ARGV[4], ARGV[2])
  local old = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', tonumber(ARGV[4]) - 600,
    'LIMIT', 0, 100)
  for _, id in ipairs(old) do
    redis.call('HDEL', KEYS[3], id)
    redis.call('ZREM', KEYS[4], id)
  end
  -- A node the heartbeat already finds silent (suspect, down) is the heartbeat's case: a
  -- probe failure counts against a node that reports but does not answer, and must not
  -- follow a silent node (say, a dead agent restarted) back into service.
  local state = redis.call('HGET', node, 'state')
  if state == 'suspect' or state == 'down' then
    return {target, tonumber(redis.call('HGET', node, 'probe_failures') or '0')}
  end
  return {target, redis.call('HINCRBY', node, 'probe_failures', 1)}
end
if ARGV[1] ~= 'ok' then return false end
local late = redis.call('HGET', KEYS[3], ARGV[2])
if not late then return false end
local sep = string.find(late, '|', 1, true)
local late_target, deadline = string.sub(late, 1, sep - 1), tonumber(string.sub(late, sep + 1))
if ARGV[6] ~= '' and ARGV[6] ~= late_target then return {late_target, -1} end
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[2])
if tonumber(ARGV[5]) > deadline then return false end
redis.call('HSET', ARGV[3] .. late_target, 'probe_failures', 0, 'probe_ok_at', ARGV[4])
return {late_target, 0}
"""


class ProbeStore:
    """The centre's active probes: what is due, what is pending, what failed."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._claim = redis.register_script(CLAIM_PROBES)
        self._end = redis.register_script(END_PROBE)

    def _targets(self) -> str:
        return self.keys.probes_pending() + ":targets"

    async def claim_due(self, cluster: str, now: datetime, period_s: float,
                        limit: int = 500) -> list[str]:
        ids = await self._claim(keys=[self.keys.probe_due(cluster)],
                                args=[now.timestamp(), period_s, limit])
        return [text(i) for i in ids]

    async def request_once(self, cluster: str, node: str, ttl_s: float) -> bool:
        """True once per `ttl_s` for a node: keeps a request from repeating every report."""
        key = self.keys.interval_request(cluster, node)
        return bool(await self.redis.set(key, b"1", nx=True, px=int(ttl_s * 1000)))

    async def probe_now(self, cluster: str, node: str, now: datetime) -> None:
        """Probe a node at the next tick (its heartbeat was missed)."""
        await self.redis.zadd(self.keys.probe_due(cluster), {node: now.timestamp()})

    async def pending(self, command_id: str, cluster: str, node: str, deadline: float) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._targets(), command_id, f"{cluster}:{node}")
            pipe.zadd(self.keys.probes_pending(), {command_id: deadline})
            await pipe.execute()

    async def end(self, command_id: str, answered: bool, now: datetime,
                  sent_at: datetime | None = None,
                  sender: tuple[str, str] | None = None) -> tuple[str, int] | None:
        """(cluster:node, failed probes in a row) if this ended a probe (or cleared a failure
        that a late-read answer, sent in time, shows was the centre's own lag); an answer
        whose `sender` (cluster, node) is not the probed node ends nothing: (target, -1)."""
        late = self.keys.probes_pending() + ":late"
        result = await self._end(
            keys=[self.keys.probes_pending(), self._targets(), late, late + ":index"],
            args=["ok" if answered else "expired", command_id, self.keys.node_prefix(),
                  now.timestamp(), (sent_at or now).timestamp(),
                  "" if sender is None else f"{sender[0]}:{sender[1]}"],
        )
        return (text(result[0]), int(result[1])) if result else None

    async def expired(self, now: datetime, limit: int = 1_000) -> list[str]:
        return members(await self.redis.zrangebyscore(
            self.keys.probes_pending(), "-inf", now.timestamp(), start=0, num=limit))
