"""The backend as its least-privilege service account (deploy/kubernetes/rbac.yaml), through
impersonation: it works, it may do nothing more than the role says, and without the role it
fails closed with a clear error."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from services.backends.base import BackendForbidden, Outcome, StepRef
from services.backends.budget import TokenBucket
from services.backends.kubernetes.backend import KubernetesBackend
from services.backends.kubernetes.connection import KubeAccess, connect
from tests.kube import KubeScope, manifest, settled

OFFLINE = StepRef(task_id="task-1", step="0:offline_node")
DRAIN = StepRef(task_id="task-1", step="1:drain_node")


def as_user(kube_api: KubeAccess, user: str) -> KubeAccess:
    return KubeAccess(kubeconfig=kube_api.kubeconfig, impersonate=user)


async def test_the_service_account_offlines_drains_and_onlines_a_node(
        kube: KubeScope, kube_api: KubeAccess) -> None:
    user = await kube.add_service_account("warden", bound=True)
    bad = await kube.add_gpu_node("bad")
    await kube.add_gpu_statefulset("train", 1, gpus=8)
    await settled(lambda: _running(kube, bad), "the train pod Running on the bad node")
    await kube.add_gpu_node("good")

    backend = await KubernetesBackend.open(as_user(kube_api, user), TokenBucket(10.0, 2))
    try:
        assert (await backend.offline_node(bad, OFFLINE, "xid 79")).outcome is Outcome.APPLIED
        drained = await backend.drain_node(bad, DRAIN, timeout_s=60.0)
        assert drained.complete, drained
        assert drained.moved[0].to_node == f"{kube.prefix}-good"
        inventory = await backend.inventory()
        assert f"{kube.prefix}-good" in {n.name for n in inventory.nodes}
        assert (await backend.online_node(bad, OFFLINE)).outcome is Outcome.APPLIED
    finally:
        await backend.close()


async def _running(kube: KubeScope, node: str) -> bool:
    return await kube.running_on(node) == ["train-0"]


@pytest.mark.parametrize(("verb", "resource", "subresource", "allowed"), [
    ("patch", "nodes", "", True),
    ("watch", "pods", "", True),
    # The checkpoint request before an eviction is an annotation on the pod.
    ("patch", "pods", "", True),
    ("create", "pods", "eviction", True),
    ("delete", "pods", "", False),
    ("delete", "nodes", "", False),
    ("update", "nodes", "status", False),
    ("get", "secrets", "", False),
    ("list", "cluster.x-k8s.io/machines", "", True),
    ("patch", "cluster.x-k8s.io/machines", "", True),
    ("delete", "cluster.x-k8s.io/machines", "", False),
    ("patch", "cluster.x-k8s.io/machinedeployments", "", True),
])
async def test_the_role_allows_exactly_what_the_backend_needs(
        kube: KubeScope, kube_api: KubeAccess, verb: str, resource: str, subresource: str,
        allowed: bool) -> None:
    user = await kube.add_service_account("warden", bound=True)
    group, _, plural = resource.rpartition("/")
    api = await connect(as_user(kube_api, user))
    try:
        review = await client.AuthorizationV1Api(api).create_self_subject_access_review(
            manifest({"spec": {"resourceAttributes": {"verb": verb, "group": group,
                                                      "resource": plural,
                                                      "subresource": subresource}}}))
        assert review.status.allowed is allowed
    finally:
        await api.close()


async def test_without_the_role_the_backend_fails_closed_with_a_clear_error(
        kube: KubeScope, kube_api: KubeAccess) -> None:
    user = await kube.add_service_account("nobody", bound=False)
    with pytest.raises(BackendForbidden, match=r"refused ClusterWarden's credentials \(403\)"):
        await KubernetesBackend.open(as_user(kube_api, user), TokenBucket(10.0, 2))


async def test_a_forbidden_write_fails_closed_and_changes_nothing(
        kube: KubeScope, kube_api: KubeAccess) -> None:
    name = await kube.add_gpu_node("a")
    # A role that reads nodes but may not patch them: the read passes, the write is refused.
    user = await kube.add_service_account("reader", bound=True, rules=[
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}])
    weak = KubernetesBackend(await connect(as_user(kube_api, user)), TokenBucket(10.0, 2))
    try:
        with pytest.raises(BackendForbidden,
                           match=r"patch node .*cannot patch resource \"nodes\""):
            await weak.offline_node(name, OFFLINE, "xid 79")
    finally:
        await weak.close()
    node = await kube.node(name)
    assert not node["spec"].get("unschedulable")
