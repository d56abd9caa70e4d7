"""The names ClusterWarden writes and reads on a Kubernetes cluster, in one place: the backend
(services/backends/kubernetes) writes them, the agent on a Kubernetes node reads them."""

from typing import Final

GPU_RESOURCE: Final = "nvidia.com/gpu"
"""The extended resource GPU pods ask for and GPU nodes offer (device plugin, GPU operator)."""

TAINT_KEY: Final = "clusterwarden.io/unhealthy"
"""The taint offline sets (value: the reason as a label value)."""

OFFLINE_ANNOTATION: Final = "clusterwarden.io/offline"
"""ClusterWarden's claim on a node it cordoned: which task and step, why, which effect."""

STEP_ANNOTATION: Final = "clusterwarden.io/step"
"""On an Eviction: the task and step that asked for it."""
