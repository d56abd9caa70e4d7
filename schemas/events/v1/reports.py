"""What an agent reports every interval: metrics, faults, jobs, peer probes, served models."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from schemas.envelope import Envelope, Identifier, ShortText, Strict
from schemas.events.v1.values import (
    Count,
    MiB,
    ModelVersion,
    NodeMode,
    Percent,
    ProbeAddress,
    Seq,
)

GpuSource = Literal["nvml", "simulated"]
# disk_full and memory_pressure are the analyzer's reading of host metrics out of range.
# partitioned is the collector's reading of peer probes: peers cannot reach a node that reports.
# node_condition: on Kubernetes, the agent's Node says it is not Ready, or carries a condition
# of the node-problem-detector kind (GPUProblem, KernelDeadlock, ...) that is True.
FaultKind = Literal["xid", "ecc", "hung_job", "probe_failed", "heartbeat_missed", "agent",
                    "disk_full", "memory_pressure", "partitioned", "node_condition"]
ModelState = Literal["loading", "ready", "failed"]
# The job states in which a job can be moved to another node (checkpointing, stopped, failed
# and hung jobs are not doing work that another node could take over as it is).
MOVABLE_JOB_STATES: frozenset[str] = frozenset({"running", "starting"})


class GpuMetrics(Strict):
    """One GPU as NVML (or the simulated device) sees it."""

    index: Annotated[int, Field(ge=0, le=63)]
    uuid: ShortText
    name: ShortText
    utilization_pct: Percent
    memory_used_mib: MiB
    memory_total_mib: MiB
    temperature_c: Annotated[float, Field(ge=-40.0, le=150.0)]
    power_w: Annotated[float, Field(ge=0.0, le=5_000.0)]
    ecc_corrected_volatile: Count | None = None
    ecc_uncorrected_volatile: Count | None = None
    ecc_corrected_aggregate: Count | None = None
    ecc_uncorrected_aggregate: Count | None = None
    xid_events: list[Annotated[int, Field(ge=0, le=65_535)]] = Field(
        default_factory=list, max_length=64, description="XIDs seen since the last report."
    )
    throttle_reasons: Count = 0

    @model_validator(mode="after")
    def _memory_fits(self) -> GpuMetrics:
        if self.memory_used_mib > self.memory_total_mib:
            raise ValueError("memory_used_mib exceeds memory_total_mib")
        return self


class HostMetrics(Strict):
    """Host metrics read through psutil."""

    cpu_pct: Percent
    memory_used_mib: MiB
    memory_total_mib: MiB
    disk_used_pct: Percent
    net_rx_bytes_per_s: Annotated[float, Field(ge=0.0, le=1e12)] = 0.0
    net_tx_bytes_per_s: Annotated[float, Field(ge=0.0, le=1e12)] = 0.0

    @model_validator(mode="after")
    def _memory_fits(self) -> HostMetrics:
        if self.memory_used_mib > self.memory_total_mib:
            raise ValueError("memory_used_mib exceeds memory_total_mib")
        return self


class Fault(Strict):
    """A piece of fault data: anything above the fault range (default 0) is a need."""

    kind: FaultKind
    code: Annotated[int, Field(ge=0, le=65_535)] | None = None
    gpu_index: Annotated[int, Field(ge=0, le=63)] | None = None
    detail: ShortText = ""


class JobInfo(Strict):
    """An ML job the agent runs."""

    job_id: Identifier
    kind: Literal["training", "inference"]
    state: Literal["starting", "running", "checkpointing", "stopped", "failed", "hung"]
    progress_pct: Percent = 0.0
    throughput: Annotated[float, Field(ge=0.0, le=1e9)] = 0.0
    gpu_indices: list[Annotated[int, Field(ge=0, le=63)]] = Field(
        default_factory=list, max_length=64
    )
    gang: bool = Field(
        default=False, description="One piece of a gang-scheduled job: its pieces run together "
        "or not at all, so it cannot move on its own.")
    whole_node: bool = Field(
        default=False, description="The job holds the whole node: moving it moves the hot spot.")
    do_not_disrupt: bool = Field(
        default=False, description="Its owner asked that it never be moved or stopped.")
    gpu_mapping: Literal["pod_resources", "in_name_order"] | None = Field(
        default=None, description="A Kubernetes pod's job: where its gpu_indices come from, "
        "the kubelet's pod-resources API (the GPUs it holds) or, without that socket, the "
        "next free indices in name order (the API server says how many, not which). None "
        "for a job the agent runs itself.")

    @property
    def movable(self) -> bool:
        """True for a running (or starting) job that moving to another node could help with:
        not part of a gang, not a whole-node job, not flagged do-not-disrupt."""
        return (self.state in MOVABLE_JOB_STATES
                and not (self.gang or self.whole_node or self.do_not_disrupt))


class PeerProbe(Strict):
    """The agent's probe of a peer node."""

    peer_node_id: Identifier
    reachable: bool
    rtt_ms: Annotated[float, Field(ge=0.0, le=600_000.0)] | None = None


class ServedModel(Strict):
    """A model the node serves for a task type: the router's registry is fed from these."""

    task_type: Identifier
    model: Identifier
    version: ModelVersion
    family: Identifier = Field(description="What kind of model (logreg, mlp, knn, ...).")
    state: ModelState = Field(description="Only a ready model is sent tasks.")
    max_concurrency: Annotated[int, Field(ge=1, le=1_024)] = Field(
        default=4, description="Tasks the node runs on this model at once; more are refused.")
    accuracy: Annotated[float, Field(ge=0.0, le=1.0)] | None = Field(
        default=None, description="Held-out accuracy measured when the model was loaded.")


class NodeReport(Envelope):
    """What an agent sends every interval: heartbeat, metrics, health, jobs and peer probes."""

    event_type: Literal["node_report"] = "node_report"
    node_id: Identifier
    pool: Identifier = "default"
    seq: Seq = Field(description="Per-node sequence; an older report is never used for decisions.")
    interval_s: Annotated[float, Field(gt=0.0, le=3_600.0)]
    gpu_source: GpuSource = Field(description="Where the GPU metrics came from.")
    mode: NodeMode = "active"
    gpus: list[GpuMetrics] = Field(default_factory=list, max_length=64)
    host: HostMetrics
    faults: list[Fault] = Field(default_factory=list, max_length=256)
    jobs: list[JobInfo] = Field(default_factory=list, max_length=1024)
    peer_probes: list[PeerProbe] = Field(default_factory=list, max_length=16)
    probe_address: ProbeAddress | None = Field(
        default=None, description="host:port where the node answers its peers' probes (None: "
        "an agent that predates addressed peers, found by its peers only on its own host).")
    models: list[ServedModel] = Field(
        default_factory=list, max_length=64,
        description="The ML models the node serves (empty: none, or an agent that predates "
                    "model serving).")

    @model_validator(mode="after")
    def _subject_is_node(self) -> NodeReport:
        if self.subject != self.node_id:
            raise ValueError("subject must equal node_id")
        return self
