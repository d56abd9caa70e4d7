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

STANDBY_LABEL: Final = "clusterwarden.io/standby"
"""`true` on a node of the standby pool: kept cordoned until `add_capacity` takes it."""

POOL_LABEL: Final = "clusterwarden.io/pool"
"""The ClusterWarden pool a node (or a MachineDeployment) serves; a standby node without it
serves any pool."""

CAPACITY_ANNOTATION: Final = "clusterwarden.io/capacity"
"""On a standby node ClusterWarden uncordoned, or a MachineDeployment it scaled: which task and
step did it (and, on a node, whether it is in use or being returned to standby)."""

GPU_COUNT_ANNOTATION: Final = "capacity.cluster-autoscaler.kubernetes.io/gpu-count"
"""On a MachineDeployment: the GPUs of each of its machines (the annotation the cluster
autoscaler's Cluster API provider reads for scale-from-zero)."""

CHECKPOINT_TIMEOUT_ANNOTATION: Final = "clusterwarden.io/checkpoint-timeout-s"
"""On a pod (its template): the workload speaks the checkpoint protocol, and a drain waits this
many seconds for its acknowledgement before evicting it. A pod without it is not asked."""

CHECKPOINT_REQUEST_ANNOTATION: Final = "clusterwarden.io/checkpoint-request"
"""Written by a drain on a pod before evicting it: `{"id", "task_id", "step", "requested_at"}`
(the id is `<task id>/<step>`, so a resend finds its own request)."""

CHECKPOINT_ANNOTATION: Final = "clusterwarden.io/checkpoint"
"""Written by the workload to acknowledge: `{"request": <the request's id>, "step": <training
step saved>, "path": <where, optional>}`."""

RESUMED_FROM_ANNOTATION: Final = "clusterwarden.io/resumed-from"
"""Written by the workload on the replacement pod: the training step it resumed from."""

DEPLOYMENT_NAME_LABEL: Final = "cluster.x-k8s.io/deployment-name"
"""On a Cluster API Machine: the MachineDeployment it belongs to (set by Cluster API)."""

DELETE_MACHINE_ANNOTATION: Final = "cluster.x-k8s.io/delete-machine"
"""On a Cluster API Machine: delete this one first when its MachineSet scales down (Cluster
API honours it before every delete policy). ClusterWarden sets it to the task and step."""
