"""Which GPUs each pod holds, from the kubelet's pod-resources API.

The API server says how many GPUs a pod asks for, never which: the kubelet's device manager
chose them when it admitted the pod. The kubelet answers that on a unix socket
(`/var/lib/kubelet/pod-resources/kubelet.sock`, gRPC service `v1.PodResourcesLister`): `List`
gives, per pod and container, the device ids of each resource. For `nvidia.com/gpu` the NVIDIA
device plugin's ids are the GPUs' UUIDs (`GPU-...`, which NVML reports too) or, with some
plugins and settings, their indices; `gpu_indices` maps both to the agent's NVML indices.

The few messages needed are vendored here from k8s.io/kubelet/pkg/apis/podresources/v1/api.proto
as a descriptor built in code (no generated module, no protoc at build time). Only the fields
read are declared, with their numbers from api.proto; the kubelet's other fields (topology, CPU
ids, memory, dynamic resources) are unknown fields to this reader and skipped by the parser.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from schemas.kubernetes import GPU_RESOURCE

log = logging.getLogger("clusterwarden.agent.pod_resources")

KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
SERVICE = "v1.PodResourcesLister"
LIST_METHOD = f"/{SERVICE}/List"

_STRING = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
_MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
_OPTIONAL = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED

# message -> [(field, number, repeated, message type or None for a string)], as in api.proto.
_MESSAGES: dict[str, list[tuple[str, int, bool, str | None]]] = {
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, True, "PodResources")],
    "PodResources": [("name", 1, False, None), ("namespace", 2, False, None),
                     ("containers", 3, True, "ContainerResources")],
    "ContainerResources": [("name", 1, False, None),
                           ("devices", 2, True, "ContainerDevices")],
    "ContainerDevices": [("resource_name", 1, False, None), ("device_ids", 2, True, None)],
}


def message_class(name: str) -> Any:
    """The class of one vendored message (`ListPodResourcesResponse`, ...)."""
    return _classes()[name]


@cache
def _classes() -> dict[str, Any]:
    """Every vendored message's class, built once in a descriptor pool of its own (nothing
    else's `v1` package can clash with it)."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="clusterwarden/podresources/v1/api.proto", package="v1", syntax="proto3")
    for message, fields in _MESSAGES.items():
        described = proto.message_type.add(name=message)
        for field, number, repeated, type_name in fields:
            added = described.field.add(name=field, number=number,
                                        label=_REPEATED if repeated else _OPTIONAL, type=_STRING)
            if type_name is not None:
                added.type, added.type_name = _MESSAGE, f".v1.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(proto.SerializeToString())
    return {message: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{message}"))
            for message in _MESSAGES}


def pod_gpu_devices(response: Any) -> dict[str, tuple[str, ...]]:
    """Each pod's `nvidia.com/gpu` device ids (all its containers'), by job id
    (`<namespace>.<pod>`, as agent/jobs/kube_pods.py names a pod's job)."""
    devices: dict[str, tuple[str, ...]] = {}
    for pod in response.pod_resources:
        ids = [device_id for container in pod.containers for group in container.devices
               if group.resource_name == GPU_RESOURCE for device_id in group.device_ids]
        devices[f"{pod.namespace or 'default'}.{pod.name}"[:128]] = tuple(ids)
    return devices


def gpu_indices(device_ids: Sequence[str], uuids: Sequence[str]) -> list[int]:
    """The agent's GPU indices of a pod's device ids: a GPU UUID as NVML reports it, or an
    index (device plugins configured to pass indices). An id matching no GPU of this node
    (a MIG device, another node's GPU) is left out: better no index than a wrong one."""
    by_uuid = {uuid.lower(): index for index, uuid in enumerate(uuids)}
    indices: list[int] = []
    for device_id in device_ids:
        index = by_uuid.get(device_id.strip().lower())
        if index is None and device_id.isdigit() and int(device_id) < len(uuids):
            index = int(device_id)
        if index is None:
            log.debug("device id %s matches no GPU of this node", device_id)
        elif index not in indices:
            indices.append(index)
    return sorted(indices)


def pod_gpu_indices(devices: Mapping[str, Sequence[str]],
                    uuids: Sequence[str]) -> dict[str, list[int]]:
    """Every pod's GPU indices, by job id."""
    return {job: gpu_indices(ids, uuids) for job, ids in devices.items()}


class PodResourcesClient:
    """Calls the kubelet's `List` on its pod-resources socket."""

    def __init__(self, socket: str, *, timeout_s: float = 5.0) -> None:
        self.socket = socket
        self.timeout_s = timeout_s
        # gRPC's unix target wants an absolute path: unix:///var/lib/kubelet/...
        self.target = f"unix://{Path(socket).absolute()}"

    def available(self) -> bool:
        """Whether the socket is there (the DaemonSet mounts the kubelet's folder)."""
        return Path(self.socket).is_socket()

    async def list_gpus(self) -> dict[str, tuple[str, ...]]:
        """Each pod's GPU device ids, by job id; grpc.aio.AioRpcError if the kubelet does
        not answer."""
        request, response = (message_class("ListPodResourcesRequest"),
                             message_class("ListPodResourcesResponse"))
        async with grpc.aio.insecure_channel(self.target) as channel:
            call = channel.unary_unary(LIST_METHOD, request_serializer=request.SerializeToString,
                                       response_deserializer=response.FromString)
            answer = await call(request(), timeout=self.timeout_s)
        return pod_gpu_devices(answer)
