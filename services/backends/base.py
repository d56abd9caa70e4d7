"""The seam between ClusterWarden's step actions and the systems that carry them out.

Every write a backend makes carries the task id and step that asked for it (`StepRef`), and
re-reads the object before acting, so a resend after a crash changes nothing. Each operation
answers a small named result instead of raising for the outcomes a step must tell apart: done
now, already done, refused (someone else owns the node), dry run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from schemas.events.v1 import TaintEffect


@dataclass(frozen=True)
class StepRef:
    """Which step of which task asks for a write; recorded on what the write changes."""

    task_id: str
    step: str


class Outcome(StrEnum):
    APPLIED = "applied"
    """The change was made now."""
    ALREADY = "already"
    """The object was already as asked (a resend, or ClusterWarden did it before)."""
    REFUSED = "refused"
    """Not ClusterWarden's to change: someone else owns the node (`detail` says who/why)."""
    DRY_RUN = "dry_run"
    """The server validated the change and made none."""


@dataclass(frozen=True)
class NodeResult:
    node: str
    outcome: Outcome
    detail: str = ""


class Checkpoint(StrEnum):
    """What became of a pod's checkpoint before its eviction."""

    NOT_ASKED = "not_asked"
    """The workload does not speak the protocol: SIGTERM and its termination grace period."""
    ACKED = "acked"
    """The workload saved a checkpoint and said which step."""
    TIMED_OUT = "timed_out"
    """Asked, no answer within its timeout: evicted anyway."""


@dataclass(frozen=True)
class PodMove:
    """One pod evicted from a node, and where its controller's replacement runs."""

    namespace: str
    pod: str
    from_node: str
    replacement: str | None = None
    to_node: str | None = None
    pdb_waits: int = 0
    """How many times a PodDisruptionBudget answered "not now" before the eviction went."""
    checkpoint: Checkpoint = Checkpoint.NOT_ASKED
    checkpoint_step: int | None = None
    """The training step the workload saved before the eviction (when it acknowledged)."""
    resumed_from: int | None = None
    """The step the replacement says it resumed from (when it says)."""


@dataclass(frozen=True)
class DrainResult:
    node: str
    moved: tuple[PodMove, ...] = ()
    held: tuple[str, ...] = ()
    """Pods (namespace/name) still on the node when the step's time ran out."""
    unplaced: tuple[str, ...] = ()
    """Evicted pods whose controller had no replacement Running elsewhere by then."""
    refused: str = ""
    """Why the node was not drained at all: someone else owns it (nothing was evicted)."""
    dry_run: bool = False

    @property
    def complete(self) -> bool:
        return not self.held and not self.unplaced and not self.refused


@dataclass(frozen=True)
class CapacityResult:
    pool: str
    nodes: tuple[str, ...] = ()
    """The nodes added (or given back) by the step, those of an earlier attempt included."""
    outcome: Outcome = Outcome.APPLIED
    detail: str = ""
    held: tuple[str, ...] = ()
    """Nodes being given back whose drain did not finish in the step's time (retried)."""
    replicas: tuple[int, int] | None = None
    """A scaled node group's replicas before and after (None: nodes were taken instead)."""


@dataclass(frozen=True)
class NodeGpus:
    name: str
    capacity: int
    allocatable: int
    schedulable: bool
    ready: bool
    conditions: dict[str, str] = field(default_factory=dict)
    """Every node condition's type -> status, as extra fault data."""


@dataclass(frozen=True)
class GpuPod:
    namespace: str
    name: str
    gpus: int
    node: str | None
    phase: str


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[NodeGpus, ...]
    pods_by_node: dict[str, tuple[GpuPod, ...]]
    pending: tuple[GpuPod, ...]
    """GPU pods no node took yet: queued demand."""

    @property
    def pending_gpus(self) -> int:
        return sum(pod.gpus for pod in self.pending)


@dataclass(frozen=True)
class PoolDemand:
    """A pool's queued demand as its orchestrator sees it: the work no node took yet, net of
    the capacity already asked for and on its way."""

    pool: str
    items: int
    """Jobs (pods) waiting for a node."""
    gpus: int
    """The GPUs they would take, less `on_the_way` (never below 0)."""
    on_the_way: int = 0
    """GPUs already asked for and not schedulable yet (nodes coming up)."""


class Backend(Protocol):
    """The operations templates' step actions need, as one cluster's backend does them."""

    async def offline_node(self, node: str, step: StepRef, reason: str, *,
                           effect: TaintEffect = "NoSchedule",
                           dry_run: bool = False) -> NodeResult: ...

    async def online_node(self, node: str, step: StepRef, *,
                          dry_run: bool = False) -> NodeResult: ...

    async def drain_node(self, node: str, step: StepRef, *, timeout_s: float,
                         reason: str = "drain", dry_run: bool = False) -> DrainResult: ...

    async def add_capacity(self, pool: str, count: int, step: StepRef, *,
                           timeout_s: float = 60.0, dry_run: bool = False) -> CapacityResult:
        """Adds `count` nodes to the pool (0: enough for the queued demand, at least one),
        waiting up to `timeout_s` for nodes still being made to join."""
        ...

    async def remove_capacity(self, pool: str, nodes: tuple[str, ...], step: StepRef, *,
                              count: int = 0, timeout_s: float = 60.0,
                              dry_run: bool = False) -> CapacityResult:
        """Gives back `nodes` (none named: `count` of those ClusterWarden added, 0 letting
        the backend choose), draining each within `timeout_s`."""
        ...

    async def inventory(self) -> Inventory: ...

    async def queued_demand(self, default_pool: str) -> tuple[PoolDemand, ...]:
        """Each pool's jobs waiting for a node (work with no pool named is `default_pool`'s),
        net of the capacity on its way: what the scale need counts as queued demand."""
        ...


class BackendError(Exception):
    """A backend call that did not happen; transient unless a subclass says otherwise."""


class BackendForbidden(BackendError):
    """The backend's credentials may not do this: a permanent failure, nothing was changed."""


class BackendUnsupported(BackendError):
    """This backend does not (yet) carry out the operation."""
