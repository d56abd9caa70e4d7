"""`helm install` of the chart into the real API server (deploy/local/kubernetes.sh): the API
server validates and admits every object, kwok runs the pods on GPU nodes of this test's own,
and every Deployment, the agent DaemonSet and the RBAC exist as `helm template` rendered them;
the live authorizer gives the chart's backend account exactly the backend's verbs, and its
inventory account only reads; every process is probed on its /livez and /readyz. Installed
once per Kafka security protocol: each adds its own variables, Secrets and volumes (a
projected one with SSL), which the API server must admit as rendered."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from schemas.access import SERVICE_PRINCIPALS
from services.backends.kubernetes.connection import KubeAccess, as_json
from tests.helm import CHART, HELM_TIMEOUT_S, Helm, by_kind, install_values
from tests.kube import KWOK_TOLERATION, SCOPE_LABEL, KubeScope, manifest, settled

Reader = Callable[[str, str], Awaitable[Any]]
GPU_NODE_LABEL = "nvidia.com/gpu.present"
PRINCIPALS = [p.value for p in SERVICE_PRINCIPALS]
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
# The chart's values of each protocol: credentials of every principal (kwok starts no
# container, so none is ever presented to a broker).
KAFKA: dict[str, dict[str, Any]] = {
    "PLAINTEXT": {},
    "SASL_SSL": {"securityProtocol": "SASL_SSL", "caCert": CA_PEM,
                 "users": {p: {"password": f"pw-{p}"} for p in PRINCIPALS}},
    "SSL": {"securityProtocol": "SSL", "caCert": CA_PEM,
            "users": {p: {"cert": f"CERT {p}", "key": f"KEY {p}"} for p in PRINCIPALS}},
}


def placed_on(kube: KubeScope) -> dict[str, Any]:
    """Values that put every pod on this test's kwok nodes (kwok runs them there); the
    agent's node selector is merged with the chart's own (the GPU node label)."""
    here = {SCOPE_LABEL: kube.prefix}
    return {"nodeSelector": here, "tolerations": [KWOK_TOLERATION],
            "agent": {"nodeSelector": here, "tolerations": [KWOK_TOLERATION],
                      "runtimeClassName": f"{kube.prefix}-nvidia"}}


def readers(api: client.ApiClient) -> dict[str, Reader]:
    """How to read a live object of each kind the chart makes: (name, namespace) -> object."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    return {
        "Deployment": apps.read_namespaced_deployment,
        "DaemonSet": apps.read_namespaced_daemon_set,
        "ConfigMap": core.read_namespaced_config_map,
        "Secret": core.read_namespaced_secret,
        "Service": core.read_namespaced_service,
        "ServiceAccount": core.read_namespaced_service_account,
        "ClusterRole": lambda name, _: rbac.read_cluster_role(name),
        "ClusterRoleBinding": lambda name, _: rbac.read_cluster_role_binding(name),
    }


def differences(live: Any, rendered: Any, path: str = "") -> list[str]:
    """Where the live object is not as rendered: every rendered list the same, every rendered
    field the same, beside the defaults the API server adds (an httpGet's scheme, a volume's
    mode) and the empty strings it leaves out."""
    if isinstance(rendered, dict) and isinstance(live, dict):
        return [d for k, v in rendered.items() for d in differences(live.get(k), v, f"{path}.{k}")]
    if isinstance(rendered, list) and isinstance(live, list) and len(live) == len(rendered):
        return [d for i, (got, want) in enumerate(zip(live, rendered, strict=True))
                for d in differences(got, want, f"{path}[{i}]")]
    if rendered == "" and live is None:
        return []  # the API omits an empty string (an env var set to ""), which means the same
    return [] if live == rendered else [f"{path}: live {live!r}, rendered {rendered!r}"]


async def allowed(api: client.ApiClient, user: str, verb: str, resource: str,
                  group: str = "", subresource: str = "") -> bool:
    review = await client.AuthorizationV1Api(api).create_subject_access_review(manifest({
        "spec": {"user": user, "resourceAttributes": {
            "verb": verb, "resource": resource, "group": group, "subresource": subresource}}}))
    return bool(review.status.allowed)


@pytest.mark.parametrize("protocol", list(KAFKA))
async def test_helm_install_creates_every_object_as_rendered(
        kube: KubeScope, kube_api: KubeAccess, helm_binary: str, tmp_path: Path,
        protocol: str) -> None:
    nodes = [await kube.add_gpu_node(suffix) for suffix in ("a", "b")]
    for node in nodes:
        # The label the GPU operator gives a GPU node, which the chart's agent selects.
        await kube.core.patch_node(node, {"metadata": {"labels": {GPU_NODE_LABEL: "true"}}})
    # A node is tainted not-ready until kwok takes it up, and the DaemonSet counts only the
    # nodes it may run on: installed before, --wait would accept a DaemonSet of no pods.
    for node in nodes:
        await settled(functools.partial(_ready, kube, node), f"{node} Ready and untainted")
    await kube.add_runtime_class(f"{kube.prefix}-nvidia", "nvidia")
    helm = Helm(helm_binary, tmp_path, kube_api.kubeconfig or "")
    values = install_values(**placed_on(kube), kafka=KAFKA[protocol])
    rendered = await asyncio.to_thread(helm.template, values, release=kube.prefix,
                                       namespace=kube.namespace)
    try:
        # --wait: every Deployment available and the DaemonSet's pods ready (kwok runs them).
        await asyncio.to_thread(
            helm.run, "install", kube.prefix, str(CHART), "--namespace", kube.namespace,
            "--values", helm.values_file(values), "--wait", "--timeout", f"{HELM_TIMEOUT_S}s")
        await _every_object_exists_as_rendered(kube, rendered)
        await _every_process_is_probed_on_its_health_endpoints(kube)
        await _workloads_run(kube, rendered, nodes)
        await _the_backend_account_has_exactly_the_backends_verbs(kube, rendered)
        await _the_inventory_account_only_reads(kube, rendered)
    finally:
        await asyncio.to_thread(helm.run, "uninstall", kube.prefix, "--namespace",
                                kube.namespace, "--wait", check=False)
    role = next(iter(by_kind(rendered, "ClusterRole")))
    assert not await _exists(kube, "ClusterRole", role), "uninstall left the ClusterRole"


async def _ready(kube: KubeScope, node: str) -> bool:
    live = await kube.node(node)
    conditions = {c["type"]: c["status"] for c in live.get("status", {}).get("conditions", [])}
    return conditions.get("Ready") == "True" and not live["spec"].get("taints")


async def _exists(kube: KubeScope, kind: str, name: str) -> bool:
    try:
        await readers(kube.api)[kind](name, kube.namespace)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


async def _every_object_exists_as_rendered(kube: KubeScope,
                                           rendered: list[dict[str, Any]]) -> None:
    read = readers(kube.api)
    kinds = {o["kind"] for o in rendered}
    assert kinds == set(read), f"the chart makes kinds this test does not check: {kinds}"
    for obj in rendered:
        live = as_json(kube.api, await read[obj["kind"]](obj["metadata"]["name"], kube.namespace))
        assert live["metadata"]["labels"] == obj["metadata"]["labels"], obj["metadata"]["name"]
        if obj["kind"] == "ClusterRole":
            assert live["rules"] == obj["rules"]
        if obj["kind"] == "ClusterRoleBinding":
            assert (live["roleRef"], live["subjects"]) == (obj["roleRef"], obj["subjects"])
        if obj["kind"] in ("Deployment", "DaemonSet"):
            # Replicas, resources, probes, images, volumes, placement: all as rendered.
            assert not differences(live["spec"], obj["spec"]), obj["metadata"]["name"]


async def _every_process_is_probed_on_its_health_endpoints(kube: KubeScope) -> None:
    """As the API server admitted them: liveness on /livez, readiness on /readyz, over HTTP on
    a port the container declares (the API's own, every other service's health port)."""
    apps = client.AppsV1Api(kube.api)
    for deployment in (await apps.list_namespaced_deployment(kube.namespace)).items:
        (spec,) = deployment.spec.template.spec.containers
        declared = {p.name: p.container_port for p in spec.ports}
        for probe, path in ((spec.liveness_probe, "/livez"), (spec.readiness_probe, "/readyz")):
            assert probe.http_get.path == path, deployment.metadata.name
            assert probe.http_get.scheme == "HTTP", deployment.metadata.name
            assert probe.http_get.port in declared, deployment.metadata.name
            assert probe._exec is None, deployment.metadata.name


async def _workloads_run(kube: KubeScope, rendered: list[dict[str, Any]],
                         nodes: list[str]) -> None:
    apps = client.AppsV1Api(kube.api)
    deployments = {d.metadata.name: d for d in
                   (await apps.list_namespaced_deployment(kube.namespace)).items}
    assert set(deployments) == set(by_kind(rendered, "Deployment"))
    for name, deployment in deployments.items():
        assert deployment.status.ready_replicas == deployment.spec.replicas == 1, name
    (agent,) = (await apps.list_namespaced_daemon_set(kube.namespace)).items
    assert agent.status.desired_number_scheduled == agent.status.number_ready == len(nodes)
    pods = await kube.pods()
    agents = sorted(p["spec"]["nodeName"] for p in pods
                    if p["metadata"]["labels"].get("app.kubernetes.io/component") == "agent")
    assert agents == sorted(nodes)
    assert all(p["status"]["phase"] == "Running" for p in pods)


def _bound_user(rendered: list[dict[str, Any]], suffix: str) -> str:
    (binding,) = (b for name, b in by_kind(rendered, "ClusterRoleBinding").items()
                  if name.endswith(suffix))
    (subject,) = binding["subjects"]
    return f"system:serviceaccount:{subject['namespace']}:{subject['name']}"


async def _the_inventory_account_only_reads(kube: KubeScope,
                                            rendered: list[dict[str, Any]]) -> None:
    user = _bound_user(rendered, "-inventory")
    for resource, verb in (("nodes", "watch"), ("nodes", "list"), ("pods", "watch")):
        assert await allowed(kube.api, user, verb, resource), (resource, verb)
    assert await allowed(kube.api, user, "get", "machinedeployments", "cluster.x-k8s.io")
    assert not await allowed(kube.api, user, "patch", "nodes")
    assert not await allowed(kube.api, user, "create", "pods", subresource="eviction")
    assert not await allowed(kube.api, user, "patch", "machinedeployments", "cluster.x-k8s.io")


async def _the_backend_account_has_exactly_the_backends_verbs(
        kube: KubeScope, rendered: list[dict[str, Any]]) -> None:
    user = _bound_user(rendered, "-backend")
    for resource, verb in (("nodes", "patch"), ("nodes", "watch"), ("pods", "list")):
        assert await allowed(kube.api, user, verb, resource), (resource, verb)
    assert await allowed(kube.api, user, "create", "pods", subresource="eviction")
    assert await allowed(kube.api, user, "update", "machinedeployments", "cluster.x-k8s.io",
                         "scale")
    # Evictions respect PodDisruptionBudgets; a delete would not, so the role has none.
    assert not await allowed(kube.api, user, "delete", "pods")
    assert not await allowed(kube.api, user, "get", "secrets")
