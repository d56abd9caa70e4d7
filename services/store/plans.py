"""Capacity plans: the store service records every `CapacityPlan` event (one row each,
unique by event id: a redelivered one changes nothing); the API lists them, newest first."""

from __future__ import annotations

import json
import logging
from typing import Final

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.events.v1 import CapacityPlan, PoolPlan
from services.store.db import Store, fail_closed
from services.store.models import CapacityPlanRecord
from services.store.views import PlanRow

log = logging.getLogger("clusterwarden.store.plans")
MAX_PLANS: Final = 200


async def record_plan(session: AsyncSession, event: CapacityPlan) -> bool:
    """Insert the plan in `session`'s transaction; False if it was recorded before."""
    dialect = session.get_bind().dialect.name
    insert: postgresql.Insert | sqlite.Insert
    if dialect == "postgresql":
        insert = postgresql.insert(CapacityPlanRecord)
    elif dialect == "sqlite":
        insert = sqlite.insert(CapacityPlanRecord)
    else:
        raise RuntimeError(f"the task store supports SQLite and PostgreSQL, not {dialect}")
    plan = event.plan
    done = await session.execute(insert.values(
        event_id=event.event_id, cluster_id=event.cluster_id, pool=event.pool,
        generated_at=plan.generated_at, horizon_days=plan.horizon_days, model=plan.model,
        leaves_range_at=plan.leaves_range_at,
        nodes_to_add=sum(s.nodes for s in plan.procurement),
        gpus_to_add=sum(s.gpus for s in plan.procurement),
        body=plan.model_dump(mode="json"),
    ).on_conflict_do_nothing(index_elements=["event_id"]).returning(
        CapacityPlanRecord.event_id))
    return done.scalar_one_or_none() is not None


async def list_plans(session: AsyncSession, cluster: str | None, pool: str | None,
                     limit: int) -> list[PlanRow]:
    """The newest plans first, of one cluster and/or pool if given."""
    query = select(CapacityPlanRecord)
    if cluster is not None:
        query = query.where(CapacityPlanRecord.cluster_id == cluster)
    if pool is not None:
        query = query.where(CapacityPlanRecord.pool == pool)
    rows = (await session.execute(query.order_by(
        CapacityPlanRecord.generated_at.desc(), CapacityPlanRecord.event_id).limit(
            min(limit, MAX_PLANS)))).scalars().all()
    # Through JSON: the plan is strict, and a time is text in the stored body.
    return [PlanRow(event_id=r.event_id, cluster=r.cluster_id, pool=r.pool,
                    plan=PoolPlan.model_validate_json(json.dumps(r.body))) for r in rows]


class PlanRecorder:
    """The store service's handler of `ops.capacity-plans.v1`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def record(self, event: CapacityPlan) -> bool:
        async with self.store.session() as session:
            return await record_plan(session, event)

    async def on_plan(self, event: CapacityPlan) -> None:
        if await fail_closed(self.record(event)):
            log.info("capacity plan of %s/%s recorded", event.cluster_id, event.pool)
