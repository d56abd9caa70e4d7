"""Queued demand, added up from its sources (services/shared/demand.py), and the router's
waiting index read as demand per pool."""

from __future__ import annotations

import pytest

from services.router.handlers import waiting_by_pool
from services.shared.demand import (
    ML_TASKS,
    OPS_TASKS,
    PENDING_JOBS,
    Demand,
    DemandEntry,
    parse_entries,
    total,
)

NOW = 1_000.0


def test_live_sources_add_up_and_expired_ones_do_not_count() -> None:
    entries = {
        ML_TASKS: DemandEntry(items=8, gpus=2.0, until=NOW + 3),
        PENDING_JOBS: DemandEntry(items=2, gpus=16.0, until=NOW - 0.1),  # stopped reporting
    }
    demand = total(entries, NOW, [(OPS_TASKS, 1, 0.0)])
    assert (demand.items, demand.gpus) == (9, 2.0)
    assert demand.describe() == "8 ml_tasks, 1 ops_tasks"


@pytest.mark.parametrize(
    ("gpus", "capacity", "pct"),
    [(2.0, 8, 25.0), (0.0, 8, 0.0), (3.0, 0, 300.0), (1e9, 1, 1e6)],
    ids=["a share of the up GPUs", "nothing queued", "nothing up: one GPU assumed",
         "bounded as the contract is"],
)
def test_demand_as_a_share_of_the_pools_up_gpus(gpus: float, capacity: int, pct: float) -> None:
    assert Demand(items=1, gpus=gpus).pct_of(capacity) == pct


def test_an_unreadable_entry_is_left_out() -> None:
    good = DemandEntry(items=1, gpus=0.25, until=NOW).model_dump_json()
    assert parse_entries({b"ml_tasks": good, b"pending_jobs": b"{not json"}) == {
        ML_TASKS: DemandEntry(items=1, gpus=0.25, until=NOW)}


def test_waiting_tasks_per_pool_and_those_past_their_deadline() -> None:
    waiting: dict[bytes | str, bytes | str] = {
        b"t1": b"default|1001.5", b"t2": b"default|2000", b"t3": b"gpu|1000",
        b"t4": b"gpu|999.9"}
    assert waiting_by_pool(waiting, NOW) == ({"default": 2, "gpu": 1}, ["t4"])
