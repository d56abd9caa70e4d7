"""An agent on a Kubernetes node reports which GPUs each pod holds as the kubelet says.

No kubelet can run here (kwok plays the kubelets and runs no containers), so the test serves
the kubelet's `v1.PodResourcesLister` itself, with grpcio on a unix socket, from the vendored
messages, and answers what a kubelet with the NVIDIA device plugin would: each container's
`nvidia.com/gpu` device ids (GPU UUIDs, or indices with some plugin settings). The agent is a
real process reading its pods from the real API server (a kwok node, a GPU StatefulSet) and
publishing its reports to Kafka. Before the socket exists the report gives each pod the next
free GPUs in name order and says so; once the kubelet answers, each pod's GPUs are the ones
the kubelet names, mapped through the node's GPU UUIDs to its indices.
"""

from __future__ import annotations

import tempfile
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc

from agent import fleet
from agent.device import simulated_uuid
from agent.jobs.pod_resources import SERVICE, message_class
from common.messaging import ensure_topics
from common.signing import ensure_signer_keys
from schemas.events.v1 import JobInfo, NodeReport
from schemas.kubernetes import GPU_RESOURCE
from schemas.topics import Topic
from services.backends.kubernetes.connection import KubeAccess
from tests.integration.harness import Record, name, tap
from tests.kube import KubeScope, settled

CLUSTER = "itest"
GPUS = 8


def gpu_uuid(node: str, index: int) -> str:
    """The UUID the agent's (simulated) GPU `index` reports: seeded by cluster and node."""
    return simulated_uuid(zlib.crc32(f"{CLUSTER}/{node}".encode()), index)


def answer(pods: dict[str, list[str]], namespace: str) -> Any:
    """A ListPodResourcesResponse: each pod's container holding `device ids` of nvidia.com/gpu,
    beside a device of another resource that must not count."""
    response = message_class("ListPodResourcesResponse")()
    for pod, device_ids in pods.items():
        resources = response.pod_resources.add(name=pod, namespace=namespace)
        container = resources.containers.add(name="train")
        container.devices.add(resource_name=GPU_RESOURCE, device_ids=device_ids)
        container.devices.add(resource_name="rdma/hca", device_ids=["mlx5_0"])
    return response


@asynccontextmanager
async def kubelet(socket: Path, reply: Callable[[], Any]) -> AsyncIterator[list[int]]:
    """The kubelet's pod-resources service on `socket`; yields the count of List calls."""
    calls: list[int] = []

    async def list_pods(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        calls.append(1)
        return reply()

    server = grpc.aio.server()
    handler: grpc.RpcMethodHandler[Any, Any] = grpc.unary_unary_rpc_method_handler(
        list_pods, request_deserializer=message_class("ListPodResourcesRequest").FromString,
        response_serializer=lambda message: message.SerializeToString())
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"List": handler}),))
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    try:
        yield calls
    finally:
        await server.stop(grace=None)


def jobs_of(node: str, check: Callable[[list[JobInfo]], bool]) -> Callable[[Record], bool]:
    def matches(record: Record) -> bool:
        report = NodeReport.model_validate_json(record.value)
        return report.node_id == node and check(report.jobs)
    return matches


def placed(jobs: list[JobInfo]) -> dict[str, tuple[list[int], str | None]]:
    return {job.job_id: (job.gpu_indices, job.gpu_mapping) for job in jobs}


async def test_the_agent_maps_each_pod_to_the_gpus_the_kubelet_says_it_holds(
    kafka_bootstrap: str, namespace: str, tmp_path: Path, kube: KubeScope, kube_api: KubeAccess,
) -> None:
    node = await kube.add_gpu_node("gpu")
    await kube.add_gpu_statefulset("train", 2, gpus=2)

    async def both_run() -> bool:
        return await kube.running_on(node) == ["train-0", "train-1"]

    await settled(both_run, f"both train pods Running on {node}")
    jobs = [f"{kube.namespace}.train-0", f"{kube.namespace}.train-1"]
    # A unix socket's path is short (108 bytes): not under pytest's long tmp_path.
    with tempfile.TemporaryDirectory(prefix="cw-kubelet-") as folder:
        socket = Path(folder) / "kubelet.sock"
        env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "WARDEN_NAMESPACE": namespace,
               "AGENT_KUBECONFIG": str(kube_api.kubeconfig),
               "AGENT_POD_RESOURCES_SOCKET": str(socket), "AGENT_PEER_PROBES": "0"}
        await ensure_topics(kafka_bootstrap, namespace)
        trusted = ensure_signer_keys(tmp_path / "keys")
        try:
            fleet.start_agent(node, gpus=GPUS, cluster_id=CLUSTER, namespace=namespace,
                              state_dir=tmp_path, env=env, trusted_keys=trusted,
                              interval_s=0.5, jobs="kube")
            async with tap(kafka_bootstrap, name(Topic.NODE_REPORTS, namespace)) as watch:
                # No socket yet: the next free GPUs in name order, labelled as such.
                await watch.wait_for(jobs_of(node, lambda found: placed(found) == {
                    jobs[0]: ([0, 1], "in_name_order"), jobs[1]: ([2, 3], "in_name_order")}),
                    60, "a report with the pods' GPUs in name order")
                # The kubelet: train-0 holds GPUs 6 and 3 (by UUID), train-1 GPU 5 (a plugin
                # passing indices) and a GPU of another node, which maps to nothing.
                held = {"train-0": [gpu_uuid(node, 6), gpu_uuid(node, 3)],
                        "train-1": ["5", "GPU-0f0f0f0f-of-another-node"]}
                async with kubelet(socket, lambda: answer(held, kube.namespace)) as calls:
                    await watch.wait_for(jobs_of(node, lambda found: placed(found) == {
                        jobs[0]: ([3, 6], "pod_resources"), jobs[1]: ([5], "pod_resources")}),
                        60, "a report with the GPUs the kubelet names",
                        start=len(watch.records))
                    assert calls
        finally:
            fleet.fleet_down(tmp_path)
