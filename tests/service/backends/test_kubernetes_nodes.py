"""Offline and online on a real API server: cordon + taint + claim, undone only where
ClusterWarden's claim says so; a node a person cordoned is left alone; dry run changes
nothing; a resend changes nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas.kubernetes import OFFLINE_ANNOTATION, TAINT_KEY
from services.backends.base import BackendError, Outcome, StepRef
from services.backends.kubernetes.backend import KubernetesBackend
from tests.kube import KubeScope

OFFLINE = StepRef(task_id="task-off", step="0:offline_node")
ONLINE = StepRef(task_id="task-on", step="2:online_node")


def our_taints(node: dict[str, Any]) -> list[dict[str, str]]:
    return [t for t in node["spec"].get("taints") or () if t["key"] == TAINT_KEY]


def marks(node: dict[str, Any]) -> tuple[object, ...]:
    """What offline and online may change (kwok and the node controller change the rest, so
    the resourceVersion is no measure of "nothing changed")."""
    annotations = node["metadata"].get("annotations") or {}
    return (bool(node["spec"].get("unschedulable")), our_taints(node),
            annotations.get(OFFLINE_ANNOTATION))


async def test_offline_cordons_taints_and_records_the_task_and_online_undoes_it(
        kube: KubeScope, backend: KubernetesBackend) -> None:
    name = await kube.add_gpu_node("a")
    result = await backend.offline_node(name, OFFLINE, "xid 79", effect="NoExecute")
    assert result.outcome is Outcome.APPLIED
    node = await kube.node(name)
    assert node["spec"]["unschedulable"] is True
    assert [(t["value"], t["effect"]) for t in our_taints(node)] == [("xid-79", "NoExecute")]
    claim = json.loads(node["metadata"]["annotations"][OFFLINE_ANNOTATION])
    assert claim == {"task_id": "task-off", "step": "0:offline_node", "reason": "xid 79",
                     "effect": "NoExecute"}

    again = await backend.offline_node(name, StepRef("task-off", "0:offline_node"), "xid 79",
                                       effect="NoExecute")
    assert again.outcome is Outcome.ALREADY
    assert marks(await kube.node(name)) == marks(node)

    back = await backend.online_node(name, ONLINE)
    assert back.outcome is Outcome.APPLIED
    node = await kube.node(name)
    assert not node["spec"].get("unschedulable")
    assert our_taints(node) == []
    assert OFFLINE_ANNOTATION not in (node["metadata"].get("annotations") or {})
    assert (await backend.online_node(name, ONLINE)).outcome is Outcome.ALREADY


async def test_a_node_a_person_cordoned_is_never_touched_by_offline_or_online(
        kube: KubeScope, backend: KubernetesBackend) -> None:
    name = await kube.add_gpu_node("a")
    await kube.core.patch_node(name, {"spec": {"unschedulable": True}})
    before = await kube.node(name)

    offline = await backend.offline_node(name, OFFLINE, "xid 79")
    online = await backend.online_node(name, ONLINE)

    assert offline.outcome is Outcome.REFUSED
    assert online.outcome is Outcome.REFUSED
    assert "cordoned by someone else" in offline.detail
    after = await kube.node(name)
    assert marks(after) == marks(before) == (True, [], None)


async def test_online_keeps_the_taints_others_set(kube: KubeScope,
                                                  backend: KubernetesBackend) -> None:
    name = await kube.add_gpu_node("a")
    await backend.offline_node(name, OFFLINE, "xid 79")
    node = await kube.node(name)
    other = {"key": "example.com/maintenance", "value": "rack-4", "effect": "NoSchedule"}
    await kube.core.patch_node(name, {"spec": {"taints": [*node["spec"]["taints"], other]}})

    assert (await backend.online_node(name, ONLINE)).outcome is Outcome.APPLIED
    taints = (await kube.node(name))["spec"].get("taints") or []
    assert other in [{k: t.get(k) for k in ("key", "value", "effect")} for t in taints]
    assert our_taints(await kube.node(name)) == []


async def test_dry_run_offline_and_online_change_nothing(kube: KubeScope,
                                                         backend: KubernetesBackend) -> None:
    name = await kube.add_gpu_node("a")
    before = await kube.node(name)
    assert (await backend.offline_node(name, OFFLINE, "xid 79", dry_run=True)).outcome \
        is Outcome.DRY_RUN
    assert marks(await kube.node(name)) == marks(before) == (False, [], None)

    await backend.offline_node(name, OFFLINE, "xid 79")
    offline = await kube.node(name)
    assert (await backend.online_node(name, ONLINE, dry_run=True)).outcome is Outcome.DRY_RUN
    assert marks(await kube.node(name)) == marks(offline)
    assert marks(offline)[0] is True


async def test_a_missing_node_is_a_clear_error(kube: KubeScope,
                                               backend: KubernetesBackend) -> None:
    with pytest.raises(BackendError, match="does not exist"):
        await backend.offline_node(f"{kube.prefix}-none", OFFLINE, "xid 79")
