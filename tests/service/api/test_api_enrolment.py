"""Node enrolment through the API: an admin enrols any node, again if need be; a bootstrap
token (role `node`) only a node not enrolled yet, and can do nothing else; the key handed out
is the one the collector checks that node's reports with; every enrolment is audited."""

from __future__ import annotations

import json

from common.reportauth import NodeReportKey, enrol_key, ensure_master, master_path
from services.shared.registry import register_nodes, registered_nodes
from tests.service.api.conftest import Api

ENROL = "/api/nodes/enroll"


def body(node: str, cluster: str = "c1") -> dict[str, str]:
    return {"cluster_id": cluster, "node_id": node}


async def test_a_bootstrap_token_enrols_a_new_node_with_the_collectors_key(api: Api) -> None:
    answer = await api.post(ENROL, body("node-007"), role="node")
    assert answer.status_code == 200, answer.text
    enrolled = answer.json()
    assert (enrolled["cluster_id"], enrolled["node_id"], enrolled["new"]) == ("c1", "node-007",
                                                                             True)
    key = NodeReportKey.from_json(json.dumps(enrolled["report_key"]))
    # The key the collector derives for that node from the master it checks reports with.
    master = ensure_master(master_path(api.settings.report_master_key, api.settings.state_dir))
    assert key == enrol_key(master, "c1", "node-007")
    rt = api.runtime
    assert "node-007" in await registered_nodes(rt.redis, rt.keys, "c1")
    entry = (await api.audit())[-1]
    assert (entry.action, entry.target, entry.actor, entry.result) == (
        "node_enroll", "node/c1/node-007", "bootstrap", "200")


async def test_a_bootstrap_token_cannot_take_the_key_of_an_enrolled_node(api: Api) -> None:
    assert (await api.post(ENROL, body("node-007"), role="node")).status_code == 200
    again = await api.post(ENROL, body("node-007"), role="node")
    assert again.status_code == 409, again.text
    assert "report_key" not in again.text
    assert (await api.audit())[-1].result == "409 key handed out already"


async def test_a_node_registered_ahead_of_its_agent_still_enrols_itself_once(api: Api) -> None:
    rt = api.runtime
    # An admin registered the cluster's nodes by name before their agents started.
    await register_nodes(rt.redis, rt.keys, "c1", ["node-011"])
    first = await api.post(ENROL, body("node-011"), role="node")
    assert first.status_code == 200, first.text
    assert first.json()["new"] is True
    assert (await api.post(ENROL, body("node-011"), role="node")).status_code == 409


async def test_an_admin_re_enrols_a_node_with_the_same_key(api: Api) -> None:
    first = (await api.post(ENROL, body("node-007"), role="node")).json()
    again = await api.post(ENROL, body("node-007"), role="admin")
    assert again.status_code == 200, again.text
    assert again.json()["new"] is False
    assert again.json()["report_key"] == first["report_key"]


async def test_a_bootstrap_token_reads_nothing_and_viewers_enrol_nothing(api: Api) -> None:
    assert (await api.get("/api/nodes", role="node")).status_code == 403
    assert (await api.get("/api/tasks", role="node")).status_code == 403
    assert (await api.post(ENROL, body("node-008"), role="viewer")).status_code == 403
    assert (await api.post(ENROL, body("node-008"), role="operator")).status_code == 403
    assert (await api.post(ENROL, body("node-008"), role=None)).status_code == 401


async def test_a_bad_name_is_refused_before_anything_is_enrolled(api: Api) -> None:
    for bad in ({"cluster_id": "c1", "node_id": "no spaces"},
                {"cluster_id": "c1", "node_id": "node-1", "extra": "x"},
                {"cluster_id": "c1"}):
        assert (await api.post(ENROL, bad, role="admin")).status_code == 422, bad
    rt = api.runtime
    assert await registered_nodes(rt.redis, rt.keys, "c1") == []
