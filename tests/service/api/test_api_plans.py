"""Capacity plans through the API: the store's recorded plans as JSON (newest first, by cluster
and pool) and as CSV (a row per planned day); a viewer may read them, no token may not."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from uuid import UUID

from schemas.events.v1 import CapacityPlan
from services.store.plans import record_plan
from tests.contracts.examples import capacity_plan
from tests.service.api.conftest import Api


def plan_event(n: int, pool: str = "default", hours: int = 0) -> CapacityPlan:
    event = capacity_plan()
    plan = event.plan.model_copy(
        update={"generated_at": event.plan.generated_at + timedelta(hours=hours)})
    return event.model_copy(update={"event_id": UUID(int=n), "pool": pool, "subject": pool,
                                    "plan": plan})


async def record(api: Api, *events: CapacityPlan) -> None:
    async with api.runtime.store.session() as session:
        for event in events:
            assert await record_plan(session, event)
        assert not await record_plan(session, events[0])  # a redelivery adds nothing


async def test_plans_are_listed_newest_first_by_pool(api: Api) -> None:
    await record(api, plan_event(1), plan_event(2, hours=1), plan_event(3, pool="other"))
    response = await api.get("/api/capacity/plans", cluster="local", pool="default")
    assert response.status_code == 200, response.text
    items = response.json()["items"]
    assert [i["event_id"] for i in items] == [str(UUID(int=2)), str(UUID(int=1))]
    first = items[0]["plan"]
    assert first["procurement"][0]["nodes"] == 2
    assert first["procurement"][0]["node_type"] == "8gpu"
    assert len(first["days"]) == 2
    everything = await api.get("/api/capacity/plans")
    assert len(everything.json()["items"]) == 3


async def test_the_newest_plan_downloads_as_csv(api: Api) -> None:
    await record(api, plan_event(1), plan_event(2, hours=1))
    response = await api.get("/api/capacity/plans.csv", cluster="local", pool="default")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/csv")
    assert "capacity-plan-local-default.csv" in response.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [(r["day"], r["peak_pct"], r["upper_80"], r["nodes_upper_80"]) for r in rows] == [
        ("2026-11-30", "74.0", "78.0", "11"), ("2026-12-01", "82.0", "88.0", "12")]
    assert {r["generated_at"] for r in rows} == {"2026-11-30T09:00:00+00:00"}


async def test_plans_need_a_token(api: Api) -> None:
    assert (await api.get("/api/capacity/plans", role=None)).status_code == 401
    assert (await api.get("/api/capacity/plans.csv", role=None)).status_code == 401
    assert (await api.get("/api/capacity/plans", role="viewer")).status_code == 200
