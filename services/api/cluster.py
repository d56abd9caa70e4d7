"""What the API shows of the live cluster, read from the keys other services keep in Redis.

Reads only, pipelined per cluster: node hashes and the enrolment set (collector), pool
aggregates and queued demand (collector, router), open needs and the pool utilisation history
(analyzer), pool health, offline budgets and breakers (scheduler). A value that cannot be
parsed is shown as unknown rather than failing the whole page.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import IntEnum

from pydantic import BaseModel, Field
from redis.asyncio import Redis

from schemas.events.v1 import NodeStateName
from services.executor.cluster_view import parse_jobs
from services.scheduler.breaker import BreakerState, kind_of, node_of, scope_of
from services.scheduler.breaker_store import BreakerStore
from services.scheduler.safety import budget_capacity
from services.scheduler.safety_store import SafetyStore, SafetyUnreadable
from services.scheduler.settings import SchedulerSettings
from services.shared.redis_client import Keys, text

STATES: tuple[NodeStateName, ...] = ("up", "suspect", "down", "draining", "offline")
_NODE_FIELDS = ("state", "prev_state", "mode", "pool", "gpu_util", "gpus", "jobs", "job_count",
                "fault_count", "last_report_at", "interval_s")


class Resolution(IntEnum):
    """The analyzer's pool history resolutions, s (services/analyzer/store.py POOL_HISTORY)."""

    TEN_SECONDS = 10
    MINUTE = 60
    HOUR = 3600
    DAY = 86400



class JobOut(BaseModel):
    job_id: str
    kind: str
    state: str


class HistoryPoint(BaseModel):
    at: datetime
    util_pct: float


class NodeOut(BaseModel):
    """A node as the collector last saw it (or only enrolled, if it never reported)."""

    cluster: str
    node_id: str
    pool: str | None = None
    state: str = Field(description="up, suspect, down, draining, offline, or `enrolled` "
                                   "for a node that has not reported yet.")
    previous_state: str | None = None
    mode: str | None = None
    util_pct: float | None = None
    gpus: int | None = None
    job_count: int = 0
    jobs: list[JobOut] = Field(default_factory=list)
    fault_count: int = 0
    last_report_at: datetime | None = None
    interval_s: float | None = None
    enrolled: bool = False
    history: list[HistoryPoint] = Field(default_factory=list,
                                        description="Per-minute utilisation, oldest first.")


class BudgetOut(BaseModel):
    """The pool's offline budget: roundup(fraction x nodes) - offline - not ready."""

    fraction: float
    capacity: int | None = Field(description="None: no pool health (the scheduler then "
                                             "refuses budgeted tasks).")
    in_flight: int | None
    remaining: int | None


class HealthOut(BaseModel):
    at: datetime
    unhealthy_fraction: float
    nodes_total: int


class PoolOut(BaseModel):
    pool: str
    nodes_by_state: dict[str, int]
    util_pct: float = Field(description="Mean GPU utilisation of the pool's up nodes.")
    demand_pct: float
    health: HealthOut | None
    budget: BudgetOut


class NeedOut(BaseModel):
    kind: str
    target: str
    expires_in_s: int | None


class BreakerOut(BaseModel):
    cluster: str
    name: str
    kind: str
    scope: str = Field(description="What it stops open: kind, node (ops and ML tasks on the "
                                    "node) or cluster (every ops task of the cluster).")
    node: str | None
    readable: bool
    status: str | None = None
    window: str = ""
    consecutive_failures: int = 0
    openings: int = 0
    opened_at: datetime | None = None
    trial_task: str = ""


class ClusterOut(BaseModel):
    cluster: str
    nodes_by_state: dict[str, int]
    pools: list[PoolOut]
    open_needs: list[NeedOut]
    breakers: list[BreakerOut]


def _float(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _int(value: str | None, default: int = 0) -> int:
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        return default


def _at(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


def parse_history(entries: list[bytes | str], unit_s: int = 1) -> list[HistoryPoint]:
    """"<time>:<value>" entries, newest first, as points oldest first; times count `unit_s`
    seconds (the collector's node history counts minutes, the analyzer's seconds)."""
    points: list[HistoryPoint] = []
    for raw in reversed(entries):
        stamp, _, value = text(raw).partition(":")
        at, util = _float(stamp), _float(value)
        if at is not None and util is not None:
            points.append(HistoryPoint(at=datetime.fromtimestamp(at * unit_s, UTC),
                                       util_pct=util))
    return points


def node_out(cluster: str, node: str, row: list[bytes | str | None], enrolled: bool,
             history: list[HistoryPoint]) -> NodeOut:
    """A node from its hash fields (in `_NODE_FIELDS` order)."""
    f = dict(zip(_NODE_FIELDS, (None if v is None else text(v) for v in row), strict=True))
    if f["state"] is None:
        return NodeOut(cluster=cluster, node_id=node, state="enrolled", enrolled=enrolled)
    jobs = [JobOut(job_id=j.job_id, kind=j.kind, state=j.state)
            for j in parse_jobs(f["jobs"] or "")]
    return NodeOut(
        cluster=cluster, node_id=node, pool=f["pool"], state=f["state"],
        previous_state=f["prev_state"] or None, mode=f["mode"],
        util_pct=_float(f["gpu_util"]), gpus=_int(f["gpus"], 0) if f["gpus"] else None,
        job_count=_int(f["job_count"], len(jobs)), jobs=jobs,
        fault_count=_int(f["fault_count"]), last_report_at=_at(_float(f["last_report_at"])),
        interval_s=_float(f["interval_s"]), enrolled=enrolled, history=history,
    )


def breaker_out(cluster: str, name: str, state: BreakerState | None) -> BreakerOut:
    node, scope = node_of(name), scope_of(name)
    if state is None:
        return BreakerOut(cluster=cluster, name=name, kind=kind_of(name), scope=scope,
                          node=node, readable=False)
    return BreakerOut(
        cluster=cluster, name=name, kind=kind_of(name), scope=scope, node=node, readable=True,
        status=state.status, window="".join("F" if f else "S" for f in state.window),
        consecutive_failures=state.consecutive_failures, openings=state.openings,
        opened_at=_at(state.opened_at), trial_task=state.trial_task,
    )


class ClusterReader:
    """Reads nodes, pools, needs, budgets, breakers and history for the API."""

    def __init__(self, redis: Redis, keys: Keys, scheduler: SchedulerSettings) -> None:
        self.redis = redis
        self.keys = keys
        self.scheduler = scheduler
        self.breakers = BreakerStore(redis, keys, scheduler.breaker_config)
        self.safety = SafetyStore(redis, keys, scheduler.pool_health_ttl_s)

    async def clusters(self, default: str) -> list[str]:
        """Every cluster the collector has seen, and this deployment's own."""
        seen = {text(c) for c in await self.redis.smembers(self.keys.clusters())}
        return sorted(seen | {default})

    async def _node_names(self, cluster: str) -> tuple[list[str], set[str]]:
        enrolled = {text(n) for n in await self.redis.smembers(self.keys.registry(cluster))}
        prefix = self.keys.node(cluster, "")
        reported = {text(k)[len(prefix):] async for k in
                    self.redis.scan_iter(match=f"{prefix}*", count=1000)}
        return sorted(enrolled | reported), enrolled

    async def nodes(self, cluster: str, history_minutes: int = 0) -> list[NodeOut]:
        names, enrolled = await self._node_names(cluster)
        if not names:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hmget(self.keys.node(cluster, name), list(_NODE_FIELDS))
                if history_minutes:
                    pipe.lrange(self.keys.history(cluster, name), 0, history_minutes - 1)
            replies = await pipe.execute()
        step = 2 if history_minutes else 1
        out = []
        for i, name in enumerate(names):
            history: list[HistoryPoint] = []
            if history_minutes:
                history = parse_history(replies[i * step + 1], unit_s=60)
            out.append(node_out(cluster, name, replies[i * step], name in enrolled, history))
        return out

    async def pools(self, cluster: str, now: datetime) -> list[PoolOut]:
        names = sorted(text(p) for p in await self.redis.smembers(self.keys.pools(cluster)))
        pools = []
        for pool in names:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hgetall(self.keys.pool(cluster, pool))
                pipe.get(self.keys.demand(cluster, pool))
                aggregate, demand = await pipe.execute()
            fields = {text(k): text(v) for k, v in aggregate.items()}
            by_state = {s: max(0, _int(fields.get(f"n_{s}"))) for s in STATES}
            util_n = _int(fields.get("util_n"))
            util = (_float(fields.get("util_sum")) or 0.0) / util_n if util_n > 0 else 0.0
            health, budget = await self._safety(cluster, pool, now)
            pools.append(PoolOut(
                pool=pool, nodes_by_state={k: v for k, v in by_state.items() if v},
                util_pct=round(min(max(util, 0.0), 100.0), 3),
                demand_pct=(_float(text(demand)) or 0.0) if demand is not None else 0.0,
                health=health, budget=budget,
            ))
        return pools

    async def _safety(self, cluster: str, pool: str,
                      now: datetime) -> tuple[HealthOut | None, BudgetOut]:
        fraction = self.scheduler.offline_budget_fraction
        try:
            health = await self.safety.load_health(cluster, pool)
            in_flight: int | None = await self.safety.in_flight(cluster, pool, now.timestamp())
        except SafetyUnreadable:
            health, in_flight = None, None
        if health is None:
            return None, BudgetOut(fraction=fraction, capacity=None, in_flight=in_flight,
                                   remaining=None)
        capacity = budget_capacity(health, fraction)
        return (
            HealthOut(at=health.occurred_at, unhealthy_fraction=health.unhealthy_fraction,
                      nodes_total=health.nodes_total),
            BudgetOut(fraction=fraction, capacity=capacity, in_flight=in_flight,
                      remaining=None if in_flight is None else max(0, capacity - in_flight)),
        )

    async def open_needs(self, cluster: str) -> list[NeedOut]:
        prefix = self.keys.open_need(cluster, "", "")[:-1]  # "...need:<cluster>:"
        keys = sorted([text(k) async for k in self.redis.scan_iter(match=f"{prefix}*",
                                                                   count=1000)])
        if not keys:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.ttl(key)
            ttls = await pipe.execute()
        needs = []
        for key, ttl in zip(keys, ttls, strict=True):
            kind, _, target = key[len(prefix):].partition(":")
            needs.append(NeedOut(kind=kind, target=target,
                                 expires_in_s=int(ttl) if int(ttl) >= 0 else None))
        return needs

    async def breaker_list(self, cluster: str | None = None) -> list[BreakerOut]:
        return [breaker_out(c, name, state) for c, name, state in await self.breakers.states()
                if cluster is None or c == cluster]

    async def cluster(self, cluster: str, now: datetime) -> ClusterOut:
        pools = await self.pools(cluster, now)
        totals: dict[str, int] = {}
        for pool in pools:
            for state, n in pool.nodes_by_state.items():
                totals[state] = totals.get(state, 0) + n
        return ClusterOut(cluster=cluster, nodes_by_state=totals, pools=pools,
                          open_needs=await self.open_needs(cluster),
                          breakers=await self.breaker_list(cluster))

    def history_key(self, cluster: str, pool: str, resolution: Resolution) -> str:
        # The analyzer's list of one resolution (PoolStore.record_utilization).
        return self.keys.pool_history(cluster, pool, int(resolution))

    async def pool_history(self, cluster: str, pool: str, resolution: Resolution,
                           limit: int) -> list[HistoryPoint]:
        """The pool's effective utilisation at one resolution, oldest first."""
        entries = await self.redis.lrange(self.history_key(cluster, pool, resolution),
                                          0, limit - 1)
        return parse_history(entries)
