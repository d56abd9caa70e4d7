"""The capacity-planning loop: every pool's plan for procurement, once an hour, published as a
`CapacityPlan` on `ops.capacity-plans.v1` (the task store records it; other teams read it).

Why here: the analyzer keeps the pools' utilisation history (hourly for a year, daily for
three, `services.analyzer.store.POOL_HISTORY`) and the pools' ranges (its scale need's, with
the operators' overrides), and already runs a periodic pool loop with a lock across its
instances; the plan reads exactly those. The API's capacity page fits its day/week forecast
on demand; a plan is periodic and published whether or not anyone looks.

The math (`services.forecast.planning.capacity_plan`) takes seconds of CPU per pool, so it
runs in a process (or, by setting, a thread) executor, never on the event loop that handles
the samples. A plan is cached per pool and UTC hour (`Keys.capacity_plan`): a second tick
in the same hour, from this instance or another, publishes nothing new.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from common.clock import Clock
from common.messaging import EventBus
from schemas.events.v1 import CapacityPlan, PlanBasis, PoolPlan, now_utc
from schemas.ranges import Band
from schemas.topics import Topic
from services.analyzer.store import PoolStore
from services.executor.cluster_view import ClusterView
from services.executor.planning import PoolView
from services.forecast.planning import NodeType, PlanSettings, PoolShape, capacity_plan
from services.shared.redis_client import text

if TYPE_CHECKING:
    from services.analyzer.settings import AnalyzerSettings

log = logging.getLogger("clusterwarden.analyzer.planning")
HOUR_S = 3_600
DAY_S = 86_400
HOURS_READ = 8_760
DAYS_READ = 1_096


class PlanningArgs(BaseModel):
    """The capacity-planning loop (env ANALYZER_PLANNING__<FIELD>)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    period_s: float = Field(default=600.0, gt=0.0, le=86_400.0,
                            description="How often the loop looks; a pool is planned once "
                                        "per UTC hour whatever the period.")
    horizon_days: int = Field(default=182, ge=7, le=730)
    lead_time_days: int = Field(default=42, ge=0, le=365,
                                description="Procurement lead time: order this long before.")
    milestones_days: tuple[int, ...] = Field(default=(28, 91, 182, 365), min_length=1)
    basis: PlanBasis = Field(default="upper_80",
                             description="Which peak the nodes must hold: mean or upper_80.")
    node_type: str = Field(default="", pattern=r"^[A-Za-z0-9_.-]{0,128}$",
                           description="Name of the node added; empty: '<gpus>gpu' of the "
                                       "pool's most common node.")
    executor: Literal["process", "thread"] = "process"
    cache_ttl_s: int = Field(default=2 * HOUR_S, ge=HOUR_S)

    def plan_settings(self) -> PlanSettings:
        return PlanSettings(horizon_days=self.horizon_days,
                            lead_time_days=self.lead_time_days,
                            milestones_days=self.milestones_days, basis=self.basis)


def make_executor(kind: Literal["process", "thread"]) -> Executor:
    """One worker: plans run one at a time, beside the event loop, never on it."""
    if kind == "thread":
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="capacity-plan")
    # Spawned, not forked: the analyzer has broker and Redis threads a fork would copy.
    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))


def parse_series(entries: Sequence[bytes | str]) -> list[tuple[datetime, float]]:
    """A history list ("<epoch s>:<value>", newest first) as (time, value), oldest first."""
    out = []
    for raw in reversed(entries):
        stamp, _, value = text(raw).partition(":")
        try:
            out.append((datetime.fromtimestamp(float(stamp), UTC), float(value)))
        except ValueError:
            continue  # a malformed entry is one hour missing, not a failed plan
    return out


def pool_shape(view: PoolView, node_type: str = "") -> PoolShape:
    """The pool's up nodes and GPUs, and the node it grows by: its most common GPU count
    (the larger one on a tie); 8 GPUs for a pool with no node up."""
    counts = Counter(node.gpus for node in view.nodes if node.gpus > 0)
    gpus = max(counts, key=lambda g: (counts[g], g)) if counts else 8
    return PoolShape(nodes_now=len(view.nodes), gpus_now=view.gpus,
                     node_type=NodeType(node_type or f"{gpus}gpu", min(max(gpus, 1), 64)))


class CapacityPlanner:
    """Plans every pool once per hour and publishes the plans."""

    def __init__(self, args: PlanningArgs, pools: PoolStore, bus: EventBus,
                 band_for: Callable[[str, str], Band], executor: Executor,
                 clock: Clock = now_utc) -> None:
        self.args = args
        self.pools = pools
        self.redis = pools.redis
        self.keys = pools.keys
        self.bus = bus
        self.band_for = band_for
        self.executor = executor
        self.clock = clock

    async def tick(self) -> None:
        """One round: every pool of every cluster not yet planned this hour."""
        now = self.clock()
        for cluster, pool in await self.pools.pool_names():
            try:
                await self.plan_pool(cluster, pool, now)
            except Exception:  # one pool's failure does not keep the others unplanned
                log.exception("no capacity plan for %s/%s", cluster, pool)

    async def plan_pool(self, cluster: str, pool: str, now: datetime) -> CapacityPlan | None:
        """Plan one pool and publish it; None if it was planned this hour already."""
        key = self.keys.capacity_plan(cluster, pool, now.astimezone(UTC).strftime("%Y%m%d%H"))
        # Claimed before the fit, so two instances never plan the same pool and hour twice.
        if not await self.redis.set(key, b"", nx=True, ex=self.args.cache_ttl_s):
            return None
        try:
            plan = await self._compute(cluster, pool, now)
        except BaseException:
            await self.redis.delete(key)  # the next tick tries again
            raise
        await self.redis.set(key, plan.model_dump_json(), ex=self.args.cache_ttl_s)
        event = CapacityPlan(event_id=uuid.uuid4(), source="analyzer", occurred_at=now,
                             cluster_id=cluster, subject=pool, pool=pool, plan=plan)
        await self.bus.publish(Topic.OPS_CAPACITY_PLANS, event)
        log.info("capacity plan for %s/%s: %s, %d procurement steps", cluster, pool,
                 plan.model, len(plan.procurement))
        return event

    async def _compute(self, cluster: str, pool: str, now: datetime) -> PoolPlan:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.lrange(self.keys.pool_history(cluster, pool, HOUR_S), 0, HOURS_READ - 1)
            pipe.lrange(self.keys.pool_history(cluster, pool, DAY_S), 0, DAYS_READ - 1)
            hours, days = await pipe.execute()
        view = await ClusterView(self.redis, self.keys).pool(cluster, pool)
        shape = pool_shape(view, self.args.node_type)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.executor, capacity_plan, parse_series(hours), parse_series(days), now,
            self.band_for(cluster, pool), shape, self.args.plan_settings())



    async def close(self) -> None:
        """Stop the executor's worker (a plan under way is abandoned: the next hour plans)."""
        self.executor.shutdown(wait=False, cancel_futures=True)


def planner_for(settings: AnalyzerSettings, pools: PoolStore, bus: EventBus) -> CapacityPlanner:
    """The analyzer's planner: its planning settings, its pools' scale ranges."""
    return CapacityPlanner(settings.planning, pools, bus,
                           lambda cluster, pool: settings.ranges_for(cluster, pool).pool,
                           make_executor(settings.planning.executor))
