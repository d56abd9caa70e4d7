"""Which GPUs a pod holds, from the kubelet's pod-resources answer: device ids (GPU UUIDs, or
indices with some device plugins) mapped to the agent's NVML indices; only `nvidia.com/gpu`
devices count. The vendored messages read the kubelet's wire format: the bytes here are
encoded by hand from k8s.io/kubelet/pkg/apis/podresources/v1/api.proto's field numbers, with
fields this reader does not declare (topology, CPU ids) that it must skip."""

from __future__ import annotations

from pathlib import Path

from agent.app import make_jobs
from agent.device import SimulatedProbe, simulated_uuid
from agent.jobs.kube_pods import KubePods, pod_jobs
from agent.jobs.pod_resources import (
    KUBELET_SOCKET,
    gpu_indices,
    message_class,
    pod_gpu_devices,
    pod_gpu_indices,
)
from agent.settings import AgentSettings
from tests.unit.agent.test_kube_pods import pod

UUIDS = ["GPU-aaaa-0000", "GPU-bbbb-1111", "GPU-cccc-2222", "GPU-dddd-3333"]


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2), lengths below 128."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def varint_field(number: int, value: int) -> bytes:
    assert value < 128
    return bytes([number << 3, value])


def kubelet_answer() -> bytes:
    """ListPodResourcesResponse{pod_resources: [ml/train-0: container c with GPUs 2 and 0,
    an RDMA device, a topology and CPU ids; ml/web: a container without devices]}."""
    gpus = field(1, b"nvidia.com/gpu") + field(2, b"GPU-cccc-2222") + field(2, b"GPU-aaaa-0000")
    gpus += field(3, field(1, varint_field(1, 1)))  # topology {nodes: [{id: 1}]}
    rdma = field(1, b"rdma/hca") + field(2, b"mlx5_0")
    container = field(1, b"c") + field(2, gpus) + field(2, rdma) + field(3, bytes([4, 2, 3]))
    train = field(1, b"train-0") + field(2, b"ml") + field(3, container)
    web = field(1, b"web") + field(2, b"ml") + field(3, field(1, b"nginx"))
    return field(1, train) + field(1, web)


def test_the_kubelets_answer_parses_to_each_pods_gpu_device_ids() -> None:
    answer = message_class("ListPodResourcesResponse").FromString(kubelet_answer())
    assert pod_gpu_devices(answer) == {"ml.train-0": ("GPU-cccc-2222", "GPU-aaaa-0000"),
                                       "ml.web": ()}


def test_device_ids_map_to_nvml_indices_by_uuid_or_by_index() -> None:
    assert gpu_indices(["GPU-dddd-3333", "gpu-BBBB-1111"], UUIDS) == [1, 3]
    assert gpu_indices(["2", "0"], UUIDS) == [0, 2]  # a plugin passing indices
    # A MIG device, another node's GPU, an index past the node's GPUs: no index, not a guess.
    assert gpu_indices(["MIG-1234", "GPU-eeee-4444", "7"], UUIDS) == []
    assert gpu_indices(["GPU-aaaa-0000", "0"], UUIDS) == [0]  # named twice, held once
    assert pod_gpu_indices({"ml.a": ("GPU-cccc-2222",), "ml.b": ()}, UUIDS) == {
        "ml.a": [2], "ml.b": []}


def test_the_kubelets_gpus_replace_the_name_order_and_each_job_says_where_they_came_from() -> None:
    pods = [pod("train-0", 2), pod("train-1", 1), pod("train-2", 1, "Pending")]
    guessed = pod_jobs(pods, gpus=4)
    assert [(j.gpu_indices, j.gpu_mapping) for j in guessed] == [
        ([0, 1], "in_name_order"), ([2], "in_name_order"), ([3], "in_name_order")]
    # The kubelet says train-0 holds GPUs 3 and 1, train-1 GPU 0; train-2 is not admitted yet.
    held = {"ml.train-0": [1, 3], "ml.train-1": [0]}
    told = pod_jobs(pods, gpus=4, held=held)
    assert [(j.job_id, j.gpu_indices, j.gpu_mapping) for j in told] == [
        ("ml.train-0", [1, 3], "pod_resources"), ("ml.train-1", [0], "pod_resources"),
        ("ml.train-2", [], "pod_resources")]


def test_an_agent_on_a_kubernetes_node_asks_the_kubelet_at_its_socket(tmp_path: Path) -> None:
    settings = AgentSettings(node_id="gpu-7", jobs="kube")
    assert settings.pod_resources_socket == KUBELET_SOCKET
    probe = SimulatedProbe(2, seed=7)
    source = make_jobs(settings, tmp_path, probe.uuids)
    assert isinstance(source, KubePods)
    assert source.pod_resources is not None
    assert source.pod_resources.target == f"unix://{KUBELET_SOCKET}"
    assert source.gpu_uuids == (simulated_uuid(7, 0), simulated_uuid(7, 1))
    assert not source.pod_resources.available()  # no kubelet on this machine
    off = make_jobs(settings.model_copy(update={"pod_resources_socket": ""}), tmp_path)
    assert isinstance(off, KubePods)
    assert off.pod_resources is None
