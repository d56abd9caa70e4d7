"""Test objects on the real Kubernetes API server (deploy/local/kubernetes.sh): kwok nodes with
GPUs, GPU StatefulSets, PodDisruptionBudgets, a least-privilege service account, Cluster API
MachineDeployments (their CRD installed by the test).

Each test gets a `KubeScope`: a namespace of its own and a name prefix for its nodes, which
carry the label `clusterwarden.io/test-scope=<prefix>`; its pods select that label, so the
scheduler never places one test's pods on another test's nodes. `close()` deletes it all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from schemas.kubernetes import DEPLOYMENT_NAME_LABEL, GPU_COUNT_ANNOTATION, POOL_LABEL
from services.backends.kubernetes.actuator import (
    CAPI_GROUP,
    CAPI_VERSION,
    MACHINE_PLURAL,
    MD_PLURAL,
)
from services.backends.kubernetes.connection import MERGE_PATCH, as_json
from tests.waiting import Patience

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
RBAC = ROOT / "deploy" / "kubernetes" / "rbac.yaml"
SCOPE_LABEL = "clusterwarden.io/test-scope"
KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
GPUS_PER_NODE = "8"
# Scheduling, a controller's reaction and kwok's are each a second or so; only a broken
# control plane takes this long.
SETTLE_S = 60.0


def manifest(obj: dict[str, Any]) -> Any:
    """A manifest as a dict: the client sends one as it is, though its stubs name models."""
    return obj


async def settled(check: Callable[[], Awaitable[T | None]], what: str, *,
                  timeout_s: float = SETTLE_S) -> T:
    """Polls an async check until it answers something true (tests/waiting.py's rule)."""
    patience = Patience(what, timeout_s)
    while not (value := await check()):
        patience.give_up_if_over(value)
        await asyncio.sleep(0.1)
    return value


@dataclass
class KubeScope:
    api: client.ApiClient
    prefix: str
    nodes: list[str] = field(default_factory=list)
    cluster_objects: list[tuple[str, str]] = field(default_factory=list)

    @property
    def namespace(self) -> str:
        return self.prefix

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    async def open(self) -> None:
        await self.core.create_namespace(manifest({"metadata": {"name": self.namespace}}))

    async def add_gpu_node(self, suffix: str, *, labels: dict[str, str] | None = None,
                           cordoned: bool = False, name: str | None = None,
                           annotations: dict[str, str] | None = None,
                           kwok: bool = True) -> str:
        """A kwok node with 8 GPUs, Ready once kwok takes it up, named `<prefix>-<suffix>`
        (or `name`, for a test that needs a node's exact name: it is still this scope's, by
        its label, and deleted with it); `kwok` False: a node no kubelet plays, never Ready,
        as a machine still booting."""
        name = name or f"{self.prefix}-{suffix}"
        resources = {"cpu": "32", "memory": "256Gi", "pods": "110",
                     "nvidia.com/gpu": GPUS_PER_NODE}
        marks = {**({"kwok.x-k8s.io/node": "fake"} if kwok else {}), **(annotations or {})}
        await self.core.create_node(manifest({
            "metadata": {"name": name, "annotations": marks,
                         "labels": {SCOPE_LABEL: self.prefix, "type": "kwok",
                                    "kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"unschedulable": cordoned},
            "status": {"capacity": resources, "allocatable": resources},
        }))
        self.nodes.append(name)
        return name

    async def set_condition(self, node: str, kind: str, status: str, *, reason: str = "",
                            message: str = "") -> None:
        """Sets one condition in the Node's status, as node-problem-detector does (the
        others, kwok's Ready among them, are merged by type and kept)."""
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        await self.core.patch_node_status(node, {"status": {"conditions": [{
            "type": kind, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}]}})

    def gpu_pod_template(self, app: str, gpus: int, *, node: str | None = None,
                         pool: str | None = None,
                         annotations: dict[str, str] | None = None) -> dict[str, Any]:
        """Pods asking `gpus` GPUs each, on this scope's nodes (on `node` alone if named,
        through node affinity the scheduler honours only at placement; on nodes of `pool`
        alone if named, through their nodeSelector), with the pod template's `annotations`."""
        affinity = None
        if node is not None:
            affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}}]}}
        return {
            "metadata": {"labels": {"app": app}, "annotations": annotations or {}},
            "spec": {
                "nodeSelector": {SCOPE_LABEL: self.prefix,
                                 **({POOL_LABEL: pool} if pool else {})},
                "tolerations": [KWOK_TOLERATION],
                "affinity": affinity,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "train", "image": "trainer:latest",
                                "resources": {"limits": {"nvidia.com/gpu": str(gpus)},
                                              "requests": {"nvidia.com/gpu": str(gpus)}}}],
            },
        }

    async def add_gpu_statefulset(self, name: str, replicas: int, *, gpus: int = 1,
                                  node: str | None = None, pool: str | None = None,
                                  annotations: dict[str, str] | None = None) -> None:
        """A StatefulSet of `gpu_pod_template` pods, started in parallel."""
        await client.AppsV1Api(self.api).create_namespaced_stateful_set(self.namespace, manifest({
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas, "serviceName": name,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": {"app": name}},
                "template": self.gpu_pod_template(name, gpus, node=node, pool=pool,
                                                  annotations=annotations),
            },
        }))

    async def add_gpu_deployment(self, name: str, replicas: int, *, gpus: int = 1) -> None:
        """A Deployment of `gpu_pod_template` pods (its ReplicaSet owns them)."""
        await client.AppsV1Api(self.api).create_namespaced_deployment(self.namespace, manifest({
            "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": self.gpu_pod_template(name, gpus)},
        }))

    async def add_pdb(self, name: str, app: str, min_available: int) -> None:
        await client.PolicyV1Api(self.api).create_namespaced_pod_disruption_budget(
            self.namespace, manifest({"metadata": {"name": name},
                                      "spec": {"minAvailable": min_available,
                                               "selector": {"matchLabels": {"app": app}}}}))

    async def set_pdb_min_available(self, name: str, min_available: int) -> None:
        await client.PolicyV1Api(self.api).patch_namespaced_pod_disruption_budget(
            name, self.namespace, {"spec": {"minAvailable": min_available}})

    async def add_machine_deployment(self, name: str, replicas: int, gpus: int) -> None:
        """A Cluster API MachineDeployment in this scope's namespace (its CRD and the
        Machine's installed first): nothing makes machines for it, the test plays the
        infrastructure (`add_machine`)."""
        await install_crd(self.api, MACHINE_DEPLOYMENT_CRD)
        await install_crd(self.api, MACHINE_CRD)
        await client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            CAPI_GROUP, CAPI_VERSION, self.namespace, MD_PLURAL, manifest({
                "apiVersion": f"{CAPI_GROUP}/{CAPI_VERSION}", "kind": "MachineDeployment",
                "metadata": {"name": name, "annotations": {GPU_COUNT_ANNOTATION: str(gpus)}},
                "spec": {"clusterName": self.prefix, "replicas": replicas}}))

    async def set_machine_deployment_replicas(self, name: str, replicas: int) -> None:
        # The client's stubs omit `_content_type`; a merge patch sets the one field.
        patch: Any = client.CustomObjectsApi(self.api).patch_namespaced_custom_object
        await patch(CAPI_GROUP, CAPI_VERSION, self.namespace, MD_PLURAL, name,
                    {"spec": {"replicas": replicas}}, _content_type=MERGE_PATCH)

    async def add_machine(self, deployment: str, suffix: str, *,
                          annotations: dict[str, str] | None = None) -> tuple[str, str]:
        """The infrastructure's part of a scale-up: a Machine of the MachineDeployment (made
        by `add_machine_deployment`) and its Node, a kwok GPU node joined to the cluster, named in
        the Machine's status.nodeRef. Answers (machine, node)."""
        custom = client.CustomObjectsApi(self.api)
        name = f"{deployment}-{suffix}"
        await custom.create_namespaced_custom_object(
            CAPI_GROUP, CAPI_VERSION, self.namespace, MACHINE_PLURAL, manifest({
                "apiVersion": f"{CAPI_GROUP}/{CAPI_VERSION}", "kind": "Machine",
                "metadata": {"name": name, "labels": {DEPLOYMENT_NAME_LABEL: deployment},
                             "annotations": annotations or {}},
                "spec": {"clusterName": self.prefix}}))
        node = await self.add_gpu_node(f"machine-{suffix}")
        patch_status: Any = custom.patch_namespaced_custom_object_status
        await patch_status(CAPI_GROUP, CAPI_VERSION, self.namespace, MACHINE_PLURAL, name,
                           {"status": {"nodeRef": {"kind": "Node", "name": node}}},
                           _content_type=MERGE_PATCH)
        return name, node

    async def machine(self, name: str) -> dict[str, Any]:
        answer: dict[str, Any] = await client.CustomObjectsApi(
            self.api).get_namespaced_custom_object(CAPI_GROUP, CAPI_VERSION, self.namespace,
                                                   MACHINE_PLURAL, name)
        return answer

    async def machine_deployment(self, name: str) -> dict[str, Any]:
        answer: dict[str, Any] = await client.CustomObjectsApi(
            self.api).get_namespaced_custom_object(CAPI_GROUP, CAPI_VERSION, self.namespace,
                                                   MD_PLURAL, name)
        return answer

    async def node(self, name: str) -> dict[str, Any]:
        return as_json(self.api, await self.core.read_node(name))

    async def pods(self) -> list[dict[str, Any]]:
        answer = await self.core.list_namespaced_pod(self.namespace)
        return [as_json(self.api, p) for p in answer.items]

    async def running_on(self, node: str) -> list[str]:
        return sorted(p["metadata"]["name"] for p in await self.pods()
                      if p["spec"].get("nodeName") == node
                      and p.get("status", {}).get("phase") == "Running"
                      and not p["metadata"].get("deletionTimestamp"))

    async def add_service_account(self, name: str, *, bound: bool,
                                  rules: list[dict[str, Any]] | None = None) -> str:
        """A service account in this scope's namespace; `bound`: given ClusterWarden's
        ClusterRole from deploy/kubernetes/rbac.yaml (under this scope's name), or one of
        `rules` instead. Answers its user name, for impersonation."""
        await self.core.create_namespaced_service_account(
            self.namespace, manifest({"metadata": {"name": name}}))
        if bound:
            role = next(d for d in yaml.safe_load_all(RBAC.read_text())
                        if d["kind"] == "ClusterRole")
            role["metadata"]["name"] = f"{self.prefix}-{name}"
            if rules is not None:
                role["rules"] = rules
            rbac = client.RbacAuthorizationV1Api(self.api)
            await rbac.create_cluster_role(role)
            self.cluster_objects.append(("clusterrole", role["metadata"]["name"]))
            await rbac.create_cluster_role_binding(manifest({
                "metadata": {"name": f"{self.prefix}-{name}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": role["metadata"]["name"]},
                "subjects": [{"kind": "ServiceAccount", "name": name,
                              "namespace": self.namespace}]}))
            self.cluster_objects.append(("clusterrolebinding", role["metadata"]["name"]))
        return f"system:serviceaccount:{self.namespace}:{name}"

    async def add_runtime_class(self, name: str, handler: str) -> None:
        """A RuntimeClass (cluster-wide, so named with this scope's prefix): the API server
        refuses a pod naming one that does not exist."""
        await client.NodeV1Api(self.api).create_runtime_class(
            manifest({"metadata": {"name": name}, "handler": handler}))
        self.cluster_objects.append(("runtimeclass", name))

    async def close(self) -> None:
        rbac = client.RbacAuthorizationV1Api(self.api)
        deleters: dict[str, Callable[[str], Awaitable[Any]]] = {
            "clusterrole": rbac.delete_cluster_role,
            "clusterrolebinding": rbac.delete_cluster_role_binding,
            "runtimeclass": client.NodeV1Api(self.api).delete_runtime_class,
        }
        for kind, name in self.cluster_objects:
            await _ignore_missing(deleters[kind](name))
        await _ignore_missing(self.core.delete_namespace(self.namespace))
        # Bounded, so a benchmark's thousand nodes go in seconds without flooding the server.
        gate = asyncio.Semaphore(16)

        async def delete(node: str) -> None:
            async with gate:
                await _ignore_missing(self.core.delete_node(node))

        await asyncio.gather(*(delete(node) for node in self.nodes))


# The least of Cluster API's MachineDeployment CRD the backend needs: spec.replicas, and the
# scale subresource autoscalers use.
MACHINE_DEPLOYMENT_CRD_NAME = f"{MD_PLURAL}.{CAPI_GROUP}"
MACHINE_DEPLOYMENT_CRD: dict[str, Any] = {
    "metadata": {"name": MACHINE_DEPLOYMENT_CRD_NAME},
    "spec": {
        "group": CAPI_GROUP, "scope": "Namespaced",
        "names": {"plural": MD_PLURAL, "singular": "machinedeployment",
                  "kind": "MachineDeployment", "shortNames": ["md"]},
        "versions": [{
            "name": CAPI_VERSION, "served": True, "storage": True,
            "subresources": {"status": {}, "scale": {
                "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                         "properties": {"replicas": {"type": "integer", "minimum": 0},
                                        "clusterName": {"type": "string"}}},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}},
        }],
    },
}


# The least of Cluster API's Machine CRD the backend reads: the MachineDeployment's label,
# annotations, and status.nodeRef (set through the status subresource, as Cluster API does).
MACHINE_CRD_NAME = f"{MACHINE_PLURAL}.{CAPI_GROUP}"
MACHINE_CRD: dict[str, Any] = {
    "metadata": {"name": MACHINE_CRD_NAME},
    "spec": {
        "group": CAPI_GROUP, "scope": "Namespaced",
        "names": {"plural": MACHINE_PLURAL, "singular": "machine", "kind": "Machine",
                  "shortNames": ["ma"]},
        "versions": [{
            "name": CAPI_VERSION, "served": True, "storage": True,
            "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}},
        }],
    },
}


async def install_crd(api: client.ApiClient, crd: dict[str, Any]) -> None:
    """Installs a CRD once per API server (kept: other tests' objects may use it), and
    waits until the server serves it."""
    extensions = client.ApiextensionsV1Api(api)
    try:
        await extensions.create_custom_resource_definition(manifest(crd))
    except ApiException as err:
        if err.status != 409:
            raise

    async def served() -> bool:
        answer = as_json(api, await extensions.read_custom_resource_definition(
            crd["metadata"]["name"]))
        return any(c["type"] == "Established" and c["status"] == "True"
                   for c in (answer.get("status") or {}).get("conditions") or ())

    await settled(served, f"the CRD {crd['metadata']['name']} established")


async def _ignore_missing(request: Any) -> None:
    try:
        await request
    except ApiException as err:
        if err.status != 404:
            raise
