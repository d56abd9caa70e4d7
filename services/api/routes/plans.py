"""Capacity plans for procurement (viewer): the pools' recorded plans, newest first, as JSON
or as CSV (one row per planned day: its peak forecast, intervals, and the nodes it needs;
the procurement steps are in the JSON)."""

from __future__ import annotations

import csv
import io
from typing import Annotated, Final

from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import BaseModel

from schemas.envelope import Identifier
from services.api.deps import RuntimeDep, Viewer
from services.store.db import fail_closed
from services.store.plans import MAX_PLANS, list_plans
from services.store.views import PlanRow

router = APIRouter(prefix="/capacity", tags=["capacity"])
CSV_COLUMNS: Final = ("generated_at", "cluster", "pool", "day", "peak_pct", "lower_80",
                      "upper_80", "lower_95", "upper_95", "nodes_mean", "nodes_upper_80",
                      "node_type", "gpus_per_node")


class PlanPage(BaseModel):
    items: list[PlanRow]
    limit: int


Cluster = Annotated[Identifier | None, Query()]
Pool = Annotated[Identifier | None, Query()]
Limit = Annotated[int, Query(ge=1, le=MAX_PLANS)]


async def _plans(rt: RuntimeDep, cluster: str | None, pool: str | None,
                 limit: int) -> list[PlanRow]:
    async with rt.store.session() as session:
        return await fail_closed(list_plans(session, cluster, pool, limit))


@router.get("/plans", response_model=PlanPage, summary="Capacity plans, newest first")
async def plans(rt: RuntimeDep, _: Viewer, cluster: Cluster = None, pool: Pool = None,
                limit: Limit = 20) -> PlanPage:
    return PlanPage(items=await _plans(rt, cluster, pool, limit), limit=limit)


def plans_csv_text(rows: list[PlanRow]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        plan = row.plan
        for day in plan.days:
            writer.writerow([
                plan.generated_at.isoformat(), row.cluster, row.pool,
                day.day.date().isoformat(), day.peak_pct, day.lower_80, day.upper_80,
                day.lower_95, day.upper_95, day.nodes_mean, day.nodes_upper_80,
                plan.node_type, plan.gpus_per_node])
    return out.getvalue()


@router.get("/plans.csv", response_class=Response,
            summary="Capacity plans as CSV, one row per planned day (the newest plan alone "
                    "unless limit says more)")
async def plans_csv(rt: RuntimeDep, _: Viewer, cluster: Cluster = None, pool: Pool = None,
                    limit: Limit = 1) -> Response:
    rows = await _plans(rt, cluster, pool, limit)
    name = "-".join(p for p in ("capacity-plan", cluster, pool) if p)
    return Response(plans_csv_text(rows), media_type="text/csv; charset=utf-8",
                    headers={"Content-Disposition": f'attachment; filename="{name}.csv"'})
