"""What the analyzer knows at one moment, per node and per pool: the inputs of every need."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from schemas.events.v1 import Fault, GpuMetrics, NodeStateName


class NodeLoad(BaseModel):
    """One up node of a pool and its GPU utilisation, as the collector's pool index has it."""

    model_config = ConfigDict(frozen=True)

    node_id: str
    load_pct: float


class PoolSpread(BaseModel):
    """A pool's two ends: where work could go, and where work that could move is.

    Two of each, so that a node can always find another one than itself.
    """

    model_config = ConfigDict(frozen=True)

    lowest: tuple[NodeLoad, ...] = Field(
        default=(), description="The least loaded up nodes, least first.")
    busiest_movable: tuple[NodeLoad, ...] = Field(
        default=(), description="The most loaded up nodes with a movable job, most first.")

    def least_loaded_other(self, node_id: str) -> NodeLoad | None:
        """The least loaded up node other than `node_id` (None: there is none)."""
        return next((n for n in self.lowest if n.node_id != node_id), None)

    def busiest_movable_other(self, node_id: str) -> NodeLoad | None:
        """The busiest up node other than `node_id` that runs a movable job."""
        return next((n for n in self.busiest_movable if n.node_id != node_id), None)


class NodeObservation(BaseModel):
    """A node's state, utilisation and fault data, with the event it came from (evidence)."""

    model_config = ConfigDict(frozen=True)

    cluster_id: str
    node_id: str
    pool: str
    state: NodeStateName
    fault_count: int
    faults: tuple[Fault, ...] = ()
    consecutive_faulty: int = 0
    gpu_utilization_pct: float = 0.0
    gpus: tuple[GpuMetrics, ...] = Field(
        default=(), description="Per-GPU metrics, where the observation came from a report."
    )
    observed_at: datetime
    source_event_id: UUID
    reason: str = ""
    agent_dead: bool = Field(
        default=False, description="Silent, but its peers reach it (the collector's reading).")
    recent_fatal: dict[int, int] = Field(
        default_factory=dict,
        description="Per GPU, earlier fatal fault episodes within the repeat window.",
    )
    pool_effective_utilization_pct: float | None = Field(
        default=None, description="The pool's effective utilisation at the time, if known."
    )
    disk_used_pct: float = Field(default=0.0, description="The node's storage in use, %.")
    storage_weight: float = Field(
        default=0.0, description="The share of storage in the node's load (the rest is GPU).")
    movable_jobs: int = Field(default=0, description="Jobs on the node that could move.")
    pinned_jobs: int = Field(
        default=0, description="Running jobs that cannot move (gang, whole-node, do-not-disrupt).")
    spread: PoolSpread | None = Field(
        default=None, description="The pool's least loaded nodes and busiest movable ones.")

    @property
    def load_pct(self) -> float:
        """The node's load: GPU use, and storage use for its weight."""
        return weighed(self.gpu_utilization_pct, self.disk_used_pct, self.storage_weight)


def weighed(gpu_pct: float, storage_pct: float, storage_weight: float) -> float:
    """A load of GPU and storage use, storage counting for `storage_weight` of it."""
    return (1.0 - storage_weight) * gpu_pct + storage_weight * storage_pct


class PoolObservation(BaseModel):
    """A pool of a cluster: how many nodes in each state, and how busy the up ones are."""

    model_config = ConfigDict(frozen=True)

    cluster_id: str
    pool: str
    nodes_by_state: dict[NodeStateName, int]
    gpu_utilization_pct: float = Field(description="Mean GPU utilisation of the up nodes.")
    demand_pct: float = Field(
        default=0.0, description="Queued GPU demand as a share of the pool's capacity, %."
    )
    gpus_up: int = Field(default=0, description="GPUs of the pool's up nodes.")
    storage_pct: float = Field(default=0.0, description="Mean storage use of the up nodes.")
    storage_weight: float = Field(
        default=0.0, description="The share of storage in the pool's load (the rest is GPU).")
    queued_items: int = Field(
        default=0, description="Work queued for the pool (tasks, jobs), every source together.")
    queued_detail: str = Field(default="", description="What is queued, by source.")
    observed_at: datetime

    @property
    def nodes_total(self) -> int:
        return sum(self.nodes_by_state.values())

    @property
    def nodes_up(self) -> int:
        return self.nodes_by_state.get("up", 0)

    @property
    def load_pct(self) -> float:
        """The pool's load: GPU use, and storage use for its weight."""
        return weighed(self.gpu_utilization_pct, self.storage_pct, self.storage_weight)

    @property
    def effective_utilization_pct(self) -> float:
        """Load plus queued demand: usage alone is a poor scaling signal."""
        return self.load_pct + self.demand_pct

    @property
    def unhealthy_fraction(self) -> float:
        """Nodes suspect or down, as a share of the nodes not deliberately out of service."""
        counted = self.nodes_total - self.nodes_by_state.get("offline", 0)
        unhealthy = self.nodes_by_state.get("suspect", 0) + self.nodes_by_state.get("down", 0)
        return unhealthy / counted if counted else 0.0
