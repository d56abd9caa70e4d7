"""Nodes, clusters, breakers and capacity, read from the keys the services keep in Redis
(written here through those services' own stores)."""

from __future__ import annotations

from datetime import timedelta
from uuid import uuid4

import pytest

from schemas.events.v1 import Alert, JobInfo, NodeReport, PoolHealth, now_utc, state_from_mode
from schemas.topics import Topic
from services.analyzer.observation import PoolObservation
from services.analyzer.store import PoolStore
from services.collector.store import NodeStore
from services.scheduler.breaker import Outcome
from services.shared.audit import AuditLog
from services.shared.registry import register_nodes
from tests.contracts.examples import example
from tests.service.api.conftest import USERS, Api, read_events
from tests.unit.api.stories import offline_task

CLUSTER = "c1"


def report(node: str, seq: int, util_jobs: int = 1) -> NodeReport:
    template = example("node_report", NodeReport)
    return template.model_copy(update={
        "event_id": uuid4(), "occurred_at": now_utc(), "cluster_id": CLUSTER, "node_id": node,
        "subject": node, "seq": seq, "faults": [],
        "jobs": [JobInfo(job_id=f"{node}-train", kind="training", state="running")
                 for _ in range(util_jobs)],
    })


async def fleet(api: Api) -> None:
    """Three enrolled nodes, two of which have reported (at 40% and 90%)."""
    rt = api.runtime
    await register_nodes(rt.redis, rt.keys, CLUSTER, ["node-001", "node-002", "node-003"])
    store = NodeStore(rt.redis, rt.keys)
    await store.apply_reports([(report("node-001", 1), state_from_mode("active"), 40.0),
                               (report("node-002", 1, 0), state_from_mode("active"), 90.0)],
                              suspect_after=1.5)


async def test_nodes_show_state_utilisation_mode_and_jobs(api: Api) -> None:
    await fleet(api)
    response = await api.get("/api/nodes", cluster=CLUSTER)
    assert response.status_code == 200
    nodes = {n["node_id"]: n for n in response.json()["nodes"]}
    assert set(nodes) == {"node-001", "node-002", "node-003"}
    first = nodes["node-001"]
    assert (first["state"], first["mode"], first["pool"], first["util_pct"], first["gpus"]) == (
        "up", "active", "default", 40.0, 1)
    assert first["jobs"] == [{"job_id": "node-001-train", "kind": "training",
                              "state": "running"}]
    assert first["enrolled"] is True
    assert first["last_report_at"] is not None
    assert nodes["node-002"]["jobs"] == []
    assert nodes["node-003"]["state"] == "enrolled"
    # Without a cluster: every cluster the collector has seen.
    everything = (await api.get("/api/nodes")).json()["nodes"]
    assert {n["node_id"] for n in everything} == set(nodes)


async def test_clusters_show_pools_needs_budgets_and_breakers(api: Api) -> None:
    await fleet(api)
    rt = api.runtime
    await rt.redis.set(rt.keys.open_need(CLUSTER, "offline", "node-002"), b"1", ex=600)
    await rt.reader.safety.save_health(PoolHealth(
        event_id=uuid4(), source="analyzer", occurred_at=now_utc(), cluster_id=CLUSTER,
        subject="default", pool="default", nodes_total=20, nodes_by_state={"up": 20},
        unhealthy_fraction=0.0, gpu_utilization_pct=65.0, effective_utilization_pct=65.0))
    task = offline_task()
    await rt.reader.safety.admit_in_flight(task, capacity=2,
                                           lapses_at_s=now_utc().timestamp() + 600,
                                           now_s=now_utc().timestamp())
    for _ in range(3):
        await rt.reader.breakers.record(CLUSTER, "offline", Outcome(task_id=str(uuid4()),
                                                                   failed=True))

    response = await api.get("/api/clusters")
    assert response.status_code == 200
    clusters = {c["cluster"]: c for c in response.json()["clusters"]}
    cluster = clusters[CLUSTER]
    assert cluster["nodes_by_state"] == {"up": 2}
    [pool] = cluster["pools"]
    assert pool["pool"] == "default"
    assert pool["util_pct"] == 65.0
    assert pool["health"]["nodes_total"] == 20
    assert pool["budget"] == {"fraction": 0.1, "capacity": 2, "in_flight": 1, "remaining": 1}
    [need] = cluster["open_needs"]
    assert (need["kind"], need["target"]) == ("offline", "node-002")
    assert 0 < need["expires_in_s"] <= 600
    [breaker] = cluster["breakers"]
    assert (breaker["name"], breaker["status"], breaker["window"]) == ("offline", "OPEN", "FFF")
    assert (breaker["scope"], breaker["node"]) == ("kind", None)
    assert (await api.get("/api/breakers", cluster=CLUSTER)).json() == cluster["breakers"]


@pytest.mark.usefixtures("kafka_bootstrap")
async def test_an_admin_resets_a_breaker_audited_twice_and_announced(api: Api) -> None:
    rt = api.runtime
    for _ in range(3):
        await rt.reader.breakers.record(CLUSTER, "migrate", Outcome(task_id=str(uuid4()),
                                                                   failed=True))
    body = {"cluster": CLUSTER, "kind": "migrate", "reason": "fixed the NFS mount"}
    assert (await api.post("/api/breakers/reset", body, role="operator")).status_code == 403

    response = await api.post("/api/breakers/reset", body, role="admin")
    assert response.status_code == 200, response.text
    reset = response.json()
    assert (reset["before"]["status"], reset["after"]["status"]) == ("OPEN", "CLOSED")
    assert reset["alert_published"] is True
    state, _ = await rt.reader.breakers.load(CLUSTER, "migrate")
    assert state.status == "CLOSED"
    # The scheduler's own audit stream holds the reset, written with it atomically...
    [record] = await AuditLog(rt.redis, rt.keys).read()
    assert (record.entry.actor, record.entry.action, record.entry.reason) == (
        USERS["admin"], "breaker_reset", "fixed the NFS mount")
    assert record.entry.seq == reset["audit_seq"]
    # ... and the API's log has it too (after the operator's refusal).
    refused, entry = await api.audit()
    assert (refused.actor, refused.result) == (USERS["operator"], "403")
    assert (entry.action, entry.target, entry.result) == (
        "breaker_reset", f"breaker/{CLUSTER}/migrate", "OPEN -> CLOSED")
    [raw] = await read_events(api.settings.kafka_bootstrap_servers, api.settings.namespace,
                              Topic.OPS_ALERTS, 1)
    alert = Alert.model_validate_json(raw)
    assert (alert.kind, alert.severity) == ("breaker_reset", "info")
    assert USERS["admin"] in alert.message


async def test_resetting_an_unknown_breaker_is_404_and_audited(api: Api) -> None:
    body = {"cluster": CLUSTER, "kind": "ofline", "reason": "typo"}
    response = await api.post("/api/breakers/reset", body, role="admin")
    assert response.status_code == 404
    [entry] = await api.audit()
    assert entry.result == "404 no such breaker"
    node_scoped = {"cluster": CLUSTER, "kind": "offline@node-1", "node": "node-2",
                   "reason": "which one?"}
    assert (await api.post("/api/breakers/reset", node_scoped, role="admin")).status_code == 422


async def test_capacity_shows_history_band_and_forecast(api: Api) -> None:
    rt = api.runtime
    pools = PoolStore(rt.redis, rt.keys)
    start = now_utc().replace(second=0, microsecond=0) - timedelta(minutes=10)
    for minute in range(6):
        await pools.record_utilization(PoolObservation(
            cluster_id=CLUSTER, pool="default", nodes_by_state={"up": 3},
            gpu_utilization_pct=50.0 + minute, observed_at=start + timedelta(minutes=minute)))
    response = await api.get("/api/capacity", cluster=CLUSTER, pool="default", resolution=60)
    assert response.status_code == 200, response.text
    capacity = response.json()
    # The bucket in progress is not in the list yet.
    assert [p["util_pct"] for p in capacity["history"]] == [50.0, 51.0, 52.0, 53.0, 54.0]
    assert capacity["band"] == {"low_enter": 20.0, "low_exit": 25.0, "high_enter": 80.0,
                                "high_exit": 75.0}
    # Five minutes are no basis for a forecast: said, not failed.
    assert capacity["forecast"]["model"] == "none"
    assert capacity["capacity_report"]["proposal"] is None
    assert capacity["forecast_error"] is None
    assert (await api.get("/api/capacity", resolution=7)).status_code == 422


async def test_a_pool_heading_out_of_its_range_gets_a_shadow_scale_out(api: Api) -> None:
    await fleet(api)  # two up nodes of one GPU each
    pools = PoolStore(api.runtime.redis, api.runtime.keys)
    now = now_utc()
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(days=4)
    for half_hours in range(4 * 48):  # four days climbing from 30% to 78%
        await pools.record_utilization(PoolObservation(
            cluster_id=CLUSTER, pool="default", nodes_by_state={"up": 2},
            gpu_utilization_pct=30.0 + half_hours * 0.25,
            observed_at=start + timedelta(minutes=30 * half_hours)))
    capacity = (await api.get("/api/capacity", cluster=CLUSTER)).json()
    assert capacity["forecast_error"] is None
    forecast, report = capacity["forecast"], capacity["capacity_report"]
    assert forecast["model"] in ("trend", "daily")
    assert forecast["history_hours"] >= 90
    assert len(forecast["points"]) > 24
    assert report["nodes_now"] == 2
    proposal = report["proposal"]
    assert proposal is not None
    assert proposal["shadow"] is True
    assert proposal["nodes"] >= 1
    assert report["scale_in"] is None
    # Recorded (once per fresh forecast), never acted on.
    [recorded] = [e for e in await api.audit() if e.action == "shadow_scale_out"]
    assert (recorded.actor, recorded.target, recorded.result) == (
        "forecast", f"{CLUSTER}/default", "recorded, not acted on")
    assert recorded.detail["proposal"]["nodes"] == proposal["nodes"]
    await api.get("/api/capacity", cluster=CLUSTER)  # served from the cache: not again
    assert len([e for e in await api.audit() if e.action == "shadow_scale_out"]) == 1
