"""The collector's pool index and node fields, read back through the centre's ClusterView.

Runs against the real redis-server at REDIS_URL (a fresh key namespace per test).
"""

from __future__ import annotations

from datetime import timedelta
from typing import cast
from uuid import uuid4

import pytest
from redis.asyncio import Redis

from schemas.events.v1 import (
    Fault,
    JobInfo,
    NodeMode,
    NodeReport,
    NodeState,
    NodeStateName,
    now_utc,
    state_from_mode,
)
from services.collector.store import JOBS_LISTED, NodeRow, NodeStore
from services.executor.cluster_view import ClusterView
from services.executor.planning import JobRef
from services.shared.redis_client import Keys, members, text
from services.shared.registry import register_nodes
from tests.contracts.examples import example

CLUSTER = "c1"






def report(node: str, seq: int, *, pool: str = "default", mode: NodeMode = "active",
           gpus: int = 4, jobs: int = 1) -> NodeReport:
    template = example("node_report", NodeReport)
    gpu = template.gpus[0]
    return template.model_copy(update={
        "event_id": uuid4(), "occurred_at": now_utc(), "cluster_id": CLUSTER,
        "node_id": node, "subject": node, "seq": seq, "pool": pool, "mode": mode,
        "faults": [],
        "gpus": [gpu.model_copy(update={"index": i}) for i in range(gpus)],
        "jobs": [JobInfo(job_id=f"{node}-job{i}", kind="training" if i % 2 == 0 else "inference",
                         state="running") for i in range(jobs)],
    })


async def apply(store: NodeStore, *items: tuple[NodeReport, float]) -> list[str]:
    applied = await store.apply_reports(
        [(r, state_from_mode(r.mode), util) for r, util in items], suspect_after=1.5)
    return [a.outcome for a in applied]


async def index(redis: Redis, keys: Keys, pool: str = "default") -> dict[str, float]:
    rows = cast(list[tuple[bytes, float]],
                await redis.zrange(keys.pool_nodes(CLUSTER, pool), 0, -1, withscores=True))
    return {text(name): score for name, score in rows}


@pytest.fixture
async def store(redis: Redis, keys: Keys) -> NodeStore:
    await register_nodes(redis, keys, CLUSTER, ["n1", "n2", "n3"])
    return NodeStore(redis, keys)


async def test_up_nodes_are_indexed_with_their_utilisation_and_fields(
    redis: Redis, keys: Keys, store: NodeStore
) -> None:
    outcomes = await apply(store, (report("n1", 1, jobs=2), 80.0),
                           (report("n2", 1, gpus=8, jobs=0), 20.0),
                           (report("n3", 1, mode="draining"), 0.0))
    assert outcomes == ["ok", "ok", "ok"]
    assert await index(redis, keys) == {"n1": 80.0, "n2": 20.0}
    fields = {text(k): text(v) for k, v in (await redis.hgetall(keys.node(CLUSTER, "n1"))).items()}
    assert fields["mode"] == "active"
    assert fields["gpus"] == "4"
    assert fields["jobs"] == "n1-job0:training:running,n1-job1:inference:running"
    assert fields["job_count"] == "2"

    pool = await ClusterView(redis, keys).pool(CLUSTER, "default")
    assert [n.node_id for n in pool.nodes] == ["n1", "n2"]
    assert pool.counts == {"up": 2, "draining": 1}
    n1, n2 = pool.nodes
    assert (n1.util_pct, n1.gpus, n1.mode, n1.state) == (80.0, 4, "active", "up")
    assert n1.jobs == (JobRef("n1-job0", "training", "running"),
                       JobRef("n1-job1", "inference", "running"))
    assert (n2.gpus, n2.jobs, n2.job_count) == (8, (), 0)
    assert pool.util_pct == pytest.approx((80 * 4 + 20 * 8) / 12)

    draining = await ClusterView(redis, keys).node(CLUSTER, "n3")
    assert draining is not None
    assert (draining.state, draining.mode, draining.active) == ("draining", "draining", False)
    assert await ClusterView(redis, keys).node(CLUSTER, "nobody") is None


async def test_a_node_leaves_the_index_when_it_leaves_up_and_moves_with_its_pool(
    redis: Redis, keys: Keys, store: NodeStore
) -> None:
    await apply(store, (report("n1", 1), 50.0), (report("n2", 1), 60.0))
    await apply(store, (report("n1", 2), 55.0))
    assert await index(redis, keys) == {"n1": 55.0, "n2": 60.0}
    await apply(store, (report("n1", 3, mode="draining"), 0.0))
    assert await index(redis, keys) == {"n2": 60.0}
    await apply(store, (report("n1", 4), 10.0))  # undrained: back in
    assert await index(redis, keys) == {"n1": 10.0, "n2": 60.0}
    await apply(store, (report("n2", 2, pool="other"), 65.0))
    assert await index(redis, keys) == {"n1": 10.0}
    assert await index(redis, keys, "other") == {"n2": 65.0}
    await apply(store, (report("n1", 5, mode="offline"), 0.0))
    assert await index(redis, keys) == {}


async def test_replayed_and_older_reports_leave_the_index_alone(
    redis: Redis, keys: Keys, store: NodeStore
) -> None:
    first = report("n1", 5)
    await apply(store, (first, 40.0))
    assert await apply(store, (first, 99.0)) == ["replay"]
    assert await apply(store, (report("n1", 4, mode="draining"), 0.0)) == ["old"]
    assert await index(redis, keys) == {"n1": 40.0}


async def test_the_job_list_is_bounded_and_the_count_is_not(
    redis: Redis, keys: Keys, store: NodeStore
) -> None:
    await apply(store, (report("n1", 1, jobs=JOBS_LISTED + 6), 90.0))
    view = await ClusterView(redis, keys).node(CLUSTER, "n1")
    assert view is not None
    assert len(view.jobs) == JOBS_LISTED
    assert view.job_count == JOBS_LISTED + 6
    assert view.active_jobs == JOBS_LISTED + 6


def went(row: NodeRow, state: str, *befores: str) -> dict[str, NodeState]:
    """The sweep's announcement of `row` going to `state`, one per state it may leave."""
    event_id = uuid4()
    return {before: NodeState(
        event_id=event_id, source="collector", occurred_at=now_utc(), cluster_id=CLUSTER,
        subject=row.node_id, node_id=row.node_id, pool=row.pool,
        state=cast(NodeStateName, state), previous=cast(NodeStateName, before),
        reason="silent", last_report_at=now_utc()) for before in befores}


async def test_a_silent_node_leaves_the_index(redis: Redis, keys: Keys, store: NodeStore) -> None:
    await apply(store, (report("n1", 1), 70.0), (report("n2", 1), 30.0))
    due = await store.due_nodes(CLUSTER, now_utc() + timedelta(hours=1), limit=10)
    row = next(r for r in due if r.node_id == "n1")
    change = await store.mark_silent(CLUSTER, row, "suspect", None,
                                     went(row, "suspect", "up", "suspect", "draining"),
                                     now_utc())
    assert change is not None
    assert change.previous == "up"
    assert await index(redis, keys) == {"n2": 30.0}
    pool = await ClusterView(redis, keys).pool(CLUSTER, "default")
    assert pool.counts == {"up": 1, "suspect": 1}
    # The change and its announcement are one unit: the event waits in the outbox.
    assert await store.outbox.waiting() == 1
    # A sweep that lost the race to a newer report changes nothing, and announces nothing.
    stale = NodeRow(row.node_id, row.pool, "up", "0.000000", row.interval_s)
    assert await store.mark_silent(CLUSTER, stale, "down", None, went(stale, "down", "up"),
                                   now_utc()) is None
    assert await store.outbox.waiting() == 1


async def test_forgetting_a_node_removes_it_from_the_pool(
    redis: Redis, keys: Keys, store: NodeStore
) -> None:
    await apply(store, (report("n1", 1), 70.0), (report("n2", 1, mode="draining"), 0.0))
    assert await store.forget(CLUSTER, "n1") == "up"
    assert await store.forget(CLUSTER, "n2") == "draining"
    assert await store.forget(CLUSTER, "n2") is None
    assert await index(redis, keys) == {}
    aggregate = {text(k): text(v) for k, v in
                 (await redis.hgetall(keys.pool(CLUSTER, "default"))).items()}
    assert int(aggregate["n_up"]) == 0
    assert int(aggregate["n_draining"]) == 0
    assert int(aggregate["util_n"]) == 0
    assert not await redis.exists(keys.node(CLUSTER, "n1"))
    assert members(await redis.zrange(keys.heartbeat_due(CLUSTER), 0, -1)) == []
    assert members(await redis.zrange(keys.probe_due(CLUSTER), 0, -1)) == []


async def test_demand_is_read_with_the_pool(redis: Redis, keys: Keys, store: NodeStore) -> None:
    await apply(store, (report("n1", 1), 50.0))
    await redis.set(keys.demand(CLUSTER, "default"), "12.5")
    pool = await ClusterView(redis, keys).pool(CLUSTER, "default")
    assert pool.demand_pct == 12.5
    assert pool.util_pct == pytest.approx(62.5)


async def test_the_agents_last_fault_is_kept_for_the_online_health_check(
    redis: Redis, keys: Keys, store: NodeStore
) -> None:
    view = ClusterView(redis, keys)
    assert await view.agent_health(CLUSTER, "n1") is None
    faulty = report("n1", 1).model_copy(update={"faults": [Fault(kind="xid", code=79,
                                                                 gpu_index=0)]})
    assert await apply(store, (faulty, 50.0)) == ["ok"]
    sent = await view.last_report(CLUSTER, "n1")
    health = await view.agent_health(CLUSTER, "n1")
    assert health is not None
    assert (health.state, health.fault_count, health.fault_at) == ("up", 1, sent)
    # A later report without faults: the count goes to 0, the fault's time stays.
    assert await apply(store, (report("n1", 2, mode="offline"), 0.0)) == ["ok"]
    health = await view.agent_health(CLUSTER, "n1")
    assert health is not None
    assert (health.state, health.fault_count, health.fault_at) == ("offline", 0, sent)
