"""The capacity-planning loop on the real broker: the analyzer (a real process) plans a pool
from the hourly history in Redis, publishes a CapacityPlan on `ops.capacity-plans.v1`, and
the store service (another real process) records it; the same hour is not planned twice.

The pool: four 8-GPU nodes, 60 days of hourly history rising 0.4 points a day from 45 % with
a daily cycle of +/- 5 points: its peak passes 80 % within weeks, so the plan must leave the
range and order 8-GPU nodes. On SQLite and on PostgreSQL.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

from redis.asyncio import Redis
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from schemas.events.v1 import CapacityPlan
from schemas.topics import Topic
from services.shared.redis_client import Keys, connect_redis
from services.store.db import open_store
from services.store.models import CapacityPlanRecord
from services.store.plans import list_plans
from tests.integration.harness import name, services, stack_env, tap, until

CLUSTER = "itest"
POOL = "gpu"
NODES = ("plan-1", "plan-2", "plan-3", "plan-4")


async def seed_pool(redis: Redis, keys: Keys, now: datetime) -> None:
    """The pool as the collector and the analyzer keep it: its nodes and its hourly history."""
    # From a UTC midnight: the planner reads whole days, and a partial first day (its share
    # depending on the hour the test runs) moved the damped trend's fit enough that, run
    # between 05:00 and 13:00 UTC, the plan did not leave the range within its horizon.
    start = now.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=60)
    entries = []
    for h in range(60 * 24 + now.hour):
        at = start + timedelta(hours=h)
        value = 45 + 0.4 * h / 24 + 5 * math.sin(2 * math.pi * at.hour / 24)
        entries.append(f"{int(at.timestamp())}:{value:.3f}")
    async with redis.pipeline(transaction=False) as pipe:
        pipe.sadd(keys.clusters(), CLUSTER)
        pipe.sadd(keys.pools(CLUSTER), POOL)
        for node in NODES:
            pipe.hset(keys.node(CLUSTER, node), mapping={
                "state": "up", "mode": "active", "pool": POOL, "gpus": 8, "gpu_util": 60.0,
                "jobs": "", "job_count": 0})
            pipe.zadd(keys.pool_nodes(CLUSTER, POOL), {node: 60.0})
        pipe.lpush(keys.pool_history(CLUSTER, POOL, 3_600), *entries)  # newest ends first
        await pipe.execute()


async def test_the_loop_publishes_a_plan_and_the_store_records_it(
        kafka_bootstrap: str, redis_url: str, namespace: str, database_url: str,
        tmp_path: Path) -> None:
    keys = Keys(namespace)
    redis = connect_redis(redis_url)
    store = open_store(database_url)
    await seed_pool(redis, keys, datetime.now(UTC))
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path,
                    DATABASE_URL=database_url, ANALYZER_PLANNING__PERIOD_S="1",
                    ANALYZER_PLANNING__HORIZON_DAYS="91", ANALYZER_POOL_PERIOD_S="30")

    async def recorded() -> int:
        try:
            async with store.session() as session:
                return int((await session.execute(
                    select(func.count()).select_from(CapacityPlanRecord))).scalar_one())
        except SQLAlchemyError:
            return 0  # the service has not made the schema yet

    try:
        async with (services(env, tmp_path, names=("analyzer", "store")),
                    tap(kafka_bootstrap, name(Topic.OPS_CAPACITY_PLANS, namespace)) as plans):
            record = await plans.wait_for(lambda r: True, 120, "a capacity plan published")
            event = CapacityPlan.model_validate_json(record.value)
            assert (event.cluster_id, event.pool, event.source) == (CLUSTER, POOL, "analyzer")
            plan = event.plan
            assert plan.history_days >= 59
            assert (plan.nodes_now, plan.gpus_now, plan.node_type) == (4, 32, "8gpu")
            assert len(plan.days) == 91
            assert plan.leaves_range_at is not None
            assert plan.procurement
            assert all(s.node_type == "8gpu" and s.gpus == 8 * s.nodes for s in plan.procurement)
            await until(recorded, 60, "the plan recorded by the store")
            async with store.session() as session:
                rows = await list_plans(session, CLUSTER, POOL, 10)
            assert [r.event_id for r in rows] == [event.event_id]
            assert rows[0].plan == plan
            # Cached for the hour: later ticks of the loop publish nothing new.
            assert await redis.get(keys.capacity_plan(
                CLUSTER, POOL, plan.generated_at.strftime("%Y%m%d%H"))) is not None
            await plans.catch_up(5)
            assert len(plans.records) == 1
    finally:
        await store.close()
        await redis.aclose()
