"""What a task's steps may do: the actions an agent carries out on its node, and the centre's
own actions (capacity and job moves) that the executor carries out itself."""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from pydantic import Field, model_validator

from schemas.envelope import Identifier, Strict
from schemas.events.v1.values import Attempt, MiB, MlInput, ModelVersion, ProbeAddress

# The schema's bound on NodeReport.peer_probes: a node never probes more peers than it reports.
MAX_PEERS = 16

# ---------------------------------------------------------------- node actions


class DrainNode(Strict):
    """Stop accepting new work on a node."""

    action: Literal["drain_node"] = "drain_node"
    node_id: Identifier


class UndrainNode(Strict):
    """Accept new work again."""

    action: Literal["undrain_node"] = "undrain_node"
    node_id: Identifier


TaintEffect = Literal["NoSchedule", "NoExecute"]
"""What a backend's taint on an offline node does: keep new pods off (NoSchedule), or also
evict those that do not tolerate it (NoExecute). An agent on its own node has no taints."""


class OfflineNode(Strict):
    """Take a drained node out of service."""

    action: Literal["offline_node"] = "offline_node"
    node_id: Identifier
    effect: TaintEffect = Field(
        default="NoSchedule", description="The taint's effect where the backend taints nodes "
        "(Kubernetes); the local agents ignore it.")


class HealthCheck(Strict):
    """What must hold before a node returns to service: its backend's conditions clear (on
    Kubernetes: Ready True and no other condition True) and its agent reporting no fault for
    `hold_s`. Until then the online step waits within its timeout, then fails (retried)."""

    conditions_clear: bool = True
    hold_s: Annotated[float, Field(ge=0.0, le=3_600.0)] = 0.0


class OnlineNode(Strict):
    """Return a repaired node to service."""

    action: Literal["online_node"] = "online_node"
    node_id: Identifier
    health_check: HealthCheck | None = Field(
        default=None, description="None: the node returns at once (the need already saw its "
        "agent fault-free for the analyzer's hold).")


class MigrateJob(Strict):
    """Move a job out of its node: checkpoint it (acknowledged within `checkpoint_timeout_s`),
    stop it, and publish the checkpoint to the shared store; `start_job` brings it back up
    on `to_node_id`."""

    action: Literal["migrate_job"] = "migrate_job"
    node_id: Identifier
    job_id: Identifier
    to_node_id: Identifier | None = None
    checkpoint_timeout_s: Annotated[float, Field(gt=0.0, le=3_600.0)] = 20.0


class StartJob(Strict):
    """Start a job, optionally from a checkpoint."""

    action: Literal["start_job"] = "start_job"
    node_id: Identifier
    job_id: Identifier
    kind: Literal["training", "inference"] = "training"
    checkpoint: Identifier | None = Field(
        default=None, description="A checkpoint in the shared store to resume from."
    )


class StopJob(Strict):
    """Stop a job."""

    action: Literal["stop_job"] = "stop_job"
    node_id: Identifier
    job_id: Identifier


class SetResources(Strict):
    """Change a job's resources."""

    action: Literal["set_resources"] = "set_resources"
    node_id: Identifier
    job_id: Identifier
    gpus: Annotated[int, Field(ge=0, le=64)]
    memory_mib: MiB


class SetReportInterval(Strict):
    """Change how often the agent reports (shorter by day, longer at night)."""

    action: Literal["set_report_interval"] = "set_report_interval"
    node_id: Identifier
    interval_s: Annotated[float, Field(ge=0.5, le=3_600.0)]


class ProbeNode(Strict):
    """The centre's probe: answer at once, proving the command path works end to end."""

    action: Literal["probe_node"] = "probe_node"
    node_id: Identifier


class QueryStatus(Strict):
    """Ask the agent what became of an earlier command."""

    action: Literal["query_status"] = "query_status"
    node_id: Identifier
    command_id: UUID


class Cancel(Strict):
    """Cancel a running command."""

    action: Literal["cancel"] = "cancel"
    node_id: Identifier
    command_id: UUID


class RunInference(Strict):
    """Run one ML task on a model the node serves: which model, which version, which input.

    Sent by the router, outside the node's command ordering (it disrupts nothing and is
    idempotent by command id); the answer is a CommandResult whose `inference` says how it
    went.
    """

    action: Literal["run_inference"] = "run_inference"
    node_id: Identifier
    task_id: UUID
    attempt: Attempt
    task_type: Identifier
    model: Identifier
    version: ModelVersion
    input: MlInput
    timeout_s: Annotated[float, Field(gt=0.0, le=3_600.0)] = Field(
        default=5.0, description="The node gives up (cause timeout) after this long.")


class Peer(Strict):
    """One peer a node should probe, and where its probe listener answers."""

    node_id: Identifier
    address: ProbeAddress


class SetPeers(Strict):
    """The peers the centre assigned a node to probe (replacing any earlier list).

    Sent by the collector, outside the node's command ordering: it disrupts nothing, and an
    absolute list is idempotent. Never a template step.
    """

    action: Literal["set_peers"] = "set_peers"
    node_id: Identifier
    peers: list[Peer] = Field(max_length=MAX_PEERS)

    @model_validator(mode="after")
    def _distinct_others(self) -> SetPeers:
        ids = [p.node_id for p in self.peers]
        if len(set(ids)) != len(ids):
            raise ValueError("a peer is listed twice")
        if self.node_id in ids:
            raise ValueError("a node is not its own peer")
        return self


AgentAction = (
    DrainNode
    | UndrainNode
    | OfflineNode
    | OnlineNode
    | MigrateJob
    | StartJob
    | StopJob
    | SetResources
    | SetReportInterval
    | ProbeNode
    | QueryStatus
    | Cancel
)
# The allow-list of what the centre may ask an agent to do; anything else is rejected by the
# discriminator before any handler runs. Template steps may use the ops actions only
# (AgentAction); run_inference comes from the router.
NodeAction = AgentAction | RunInference | SetPeers
Action = Annotated[NodeAction, Field(discriminator="action")]
OpsActionName = Literal[
    "drain_node",
    "undrain_node",
    "offline_node",
    "online_node",
    "migrate_job",
    "start_job",
    "stop_job",
    "set_resources",
    "set_report_interval",
    "probe_node",
    "query_status",
    "cancel",
]
ActionName = OpsActionName | Literal["run_inference", "set_peers"]


# ---------------------------------------------------------------- centre actions
#
# Steps an agent cannot carry out alone: the executor carries them out itself, through the
# capacity provider or by splitting the step into child tasks. They are never sent to a node.


class AddCapacity(Strict):
    """Add nodes to a pool from the capacity provider.

    `nodes` 0 lets the step compute the count just before it runs, from measured capacity:
    enough to bring the pool back to the middle of its range.
    """

    action: Literal["add_capacity"] = "add_capacity"
    pool: Identifier
    nodes: Annotated[int, Field(ge=0, le=64)] = 0


class RemoveCapacity(Strict):
    """Remove nodes from a pool: one child task per node (drain, migrate its jobs, release).

    `nodes` 0 lets the step compute the count from measured capacity.
    """

    action: Literal["remove_capacity"] = "remove_capacity"
    pool: Identifier
    nodes: Annotated[int, Field(ge=0, le=64)] = 0


class MigrateJobs(Strict):
    """Move jobs: one child task per job (migrate_job out of its node, start_job elsewhere).

    With `node_id` every job of that node moves; without, jobs move from the most loaded
    nodes of the pool to the least loaded (a rebalance), at most `max_jobs` of them.
    """

    action: Literal["migrate_jobs"] = "migrate_jobs"
    pool: Identifier
    node_id: Identifier | None = None
    max_jobs: Annotated[int, Field(ge=1, le=64)] = 8


class ReleaseNode(Strict):
    """Hand a drained, emptied node back to the capacity provider (which stops it)."""

    action: Literal["release_node"] = "release_node"
    node_id: Identifier


class RestartAgent(Strict):
    """Start a node's agent again through the capacity provider: the node's peers still
    reach it, only its agent stopped reporting. Done when the node reports again."""

    action: Literal["restart_agent"] = "restart_agent"
    node_id: Identifier


CENTRE_ACTIONS: frozenset[str] = frozenset(
    {"add_capacity", "remove_capacity", "migrate_jobs", "release_node", "restart_agent"}
)

# What a step may do: an agent command, or a centre action.
StepAction = Annotated[
    AgentAction | AddCapacity | RemoveCapacity | MigrateJobs | ReleaseNode | RestartAgent,
    Field(discriminator="action"),
]
StepActionName = OpsActionName | Literal[
    "add_capacity", "remove_capacity", "migrate_jobs", "release_node", "restart_agent"
]
