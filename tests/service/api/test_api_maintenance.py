"""Maintenance windows and a node's rotation through the API: audited, kept in Redis where
the scheduler reads them, and a rotation's needs published on the real Kafka topic."""

from __future__ import annotations

import pytest

from schemas.events.v1 import OpsNeed
from schemas.topics import Topic
from services.shared.maintenance import ROTATION_METRIC, MaintenanceStore
from services.shared.registry import register_nodes
from tests.service.api.conftest import USERS, Api, read_events

CLUSTER = "c1"


async def test_a_node_maintenance_starts_once_is_listed_and_ends_audited(api: Api) -> None:
    body = {"cluster": CLUSTER, "node": "node-002", "reason": "replace the PSU"}
    started = await api.post("/api/maintenance/start", body)
    assert started.status_code == 201, started.text
    window = started.json()
    assert (window["node"], window["kind"], window["actor"]) == ("node-002", "maintenance",
                                                                 USERS["operator"])
    again = await api.post("/api/maintenance/start", body | {"reason": "again"})
    assert again.status_code == 409
    assert "already under maintenance of node node-002" in again.text
    listed = await api.get("/api/maintenance", cluster=CLUSTER)
    assert [w["window_id"] for w in listed.json()["windows"]] == [window["window_id"]]
    store = MaintenanceStore(api.runtime.redis, api.runtime.keys)
    assert set(await store.windows(CLUSTER)) == {"node:node-002"}

    ended = await api.post("/api/maintenance/end", body | {"reason": "PSU in"})
    assert ended.status_code == 200
    assert ended.json()["window_id"] == window["window_id"]
    assert (await api.post("/api/maintenance/end", body)).status_code == 404
    assert [(e.action, e.target, e.result) for e in await api.audit()] == [
        ("maintenance_start", "cluster/c1/node/node-002", "started"),
        ("maintenance_start", "cluster/c1/node/node-002", "409 already"),
        ("maintenance_end", "cluster/c1/node/node-002", "ended"),
        ("maintenance_end", "cluster/c1/node/node-002", "404 none"),
    ]


async def test_a_viewer_cannot_start_maintenance(api: Api) -> None:
    response = await api.post("/api/maintenance/start",
                              {"cluster": CLUSTER, "reason": "x"}, role="viewer")
    assert response.status_code == 403


@pytest.mark.usefixtures("kafka_bootstrap")
async def test_a_rotation_raises_an_offline_need_then_an_online_one(api: Api) -> None:
    rt = api.runtime
    await register_nodes(rt.redis, rt.keys, CLUSTER, ["node-001"])
    body = {"cluster": CLUSTER, "reason": "swap GPU 3"}
    started = await api.post("/api/nodes/node-001/rotation/start", body)
    assert started.status_code == 202, started.text
    assert started.json()["window"]["kind"] == "rotation"
    assert (await api.post("/api/nodes/node-001/rotation/start", body)).status_code == 409
    ended = await api.post("/api/nodes/node-001/rotation/end", body | {"reason": "GPU in"})
    assert ended.status_code == 202, ended.text
    assert (await api.post("/api/nodes/node-001/rotation/end", body)).status_code == 409
    raw = await read_events(api.settings.kafka_bootstrap_servers, api.settings.namespace,
                            Topic.OPS_NEEDS, 2)
    needs = [OpsNeed.model_validate_json(r) for r in raw]
    assert [(n.kind, n.target, n.pool, n.evidence[0].metric) for n in needs] == [
        ("offline", "node-001", "default", ROTATION_METRIC),
        ("online", "node-001", "default", ROTATION_METRIC)]
    assert needs[1].evidence[0].detail == f"rotation by {USERS['operator']}: GPU in"
    assert await MaintenanceStore(rt.redis, rt.keys).windows(CLUSTER) == {}


async def test_a_rotation_of_an_unknown_node_is_404_and_leaves_no_window(api: Api) -> None:
    response = await api.post("/api/nodes/node-404/rotation/start",
                              {"cluster": CLUSTER, "reason": "x"})
    assert response.status_code == 404
    rt = api.runtime
    assert await MaintenanceStore(rt.redis, rt.keys).windows(CLUSTER) == {}
