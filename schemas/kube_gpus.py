"""A pod's GPUs as Kubernetes counts them, in one place: the agent on a Kubernetes node reports
its pods' GPUs by it and the backend drains, inventories and sizes demand by it (pure
functions over the API's JSON, camelCase keys).

A container asks for `nvidia.com/gpu` in its limits (an extended resource's request defaults
to its limit and, when both are set, must equal it), so a container's count is the larger of
the two. The pod's count is its effective request, as the scheduler reserves it:

    max(sum(app containers) + sum(sidecars),
        max over regular init containers i of (i + sum(sidecars listed before i)))

where sidecars are init containers with `restartPolicy: Always` (they keep running beside the
app containers; a regular init container runs alone, beside the sidecars started before it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schemas.kubernetes import GPU_RESOURCE

SIDECAR_RESTART_POLICY = "Always"


def gpu_quantity(value: Any) -> int:
    """A quantity of whole GPUs (`"2"`, 2); anything else counts as none."""
    try:
        count = int(str(value))
    except ValueError:
        return 0
    return max(count, 0)


def container_gpus(container: Mapping[str, Any]) -> int:
    resources = container.get("resources") or {}
    return max(gpu_quantity((resources.get(kind) or {}).get(GPU_RESOURCE, 0))
               for kind in ("requests", "limits"))


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """The GPUs the scheduler reserves for the pod (its effective request)."""
    spec = pod.get("spec") or {}
    sidecars = 0
    init_peak = 0
    for container in spec.get("initContainers") or ():
        if container.get("restartPolicy") == SIDECAR_RESTART_POLICY:
            sidecars += container_gpus(container)
        else:
            init_peak = max(init_peak, container_gpus(container) + sidecars)
    running = sum(container_gpus(c) for c in spec.get("containers") or ()) + sidecars
    return max(running, init_peak)
