"""Agent settings, read from the environment with the prefix `AGENT_`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from agent.jobs.kube_node import DEFAULT_FAULTY
from common.reportauth import NODE_KEY_FILE
from common.settings import ServiceSettings
from schemas.events.v1 import check_probe_address

IDENTIFIER_PATTERN = r"^[A-Za-z0-9_.-]{1,128}$"
JOB_NAMES = ("train", "infer")
SIMULATED_JOBS = "sim"
SIMULATED_PREFIX = "sim:"
# The jobs of a Kubernetes node: its GPU pods, read from the API server (agent/jobs/kube_pods.py).
KUBE_PODS = "kube"
CHECKPOINTS_DIR = "checkpoints"


class AgentSettings(ServiceSettings):
    """What one agent needs to know: who it is, how often to report, which keys to trust."""

    model_config = SettingsConfigDict(
        env_prefix="AGENT_", extra="ignore", frozen=True, populate_by_name=True
    )

    node_id: str = Field(pattern=IDENTIFIER_PATTERN)
    pool: str = Field(default="default", pattern=IDENTIFIER_PATTERN)
    gpus: int = Field(default=2, ge=0, le=64, description="GPUs of the simulated device.")
    interval_s: float = Field(default=2.0, gt=0.0, le=3_600.0)
    # `state_dir` is taken by the shared WARDEN_STATE_DIR; this one is the agent's own.
    agent_state_dir: Path | None = Field(
        default=None,
        validation_alias="AGENT_STATE_DIR",
        description="Journal and fault plan; default "
        "<WARDEN_STATE_DIR>/agents/<cluster_id>/<node_id>.",
    )
    # NoDecode: the env value is a comma-separated list of paths, not JSON.
    trusted_keys: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="Public-key PEM files, or folders of them (their *.pub), each named for "
        "the signer role whose actions it may sign (<role>.pub or <role>.<label>.pub, role "
        "executor, collector or router; command-signing.pub: one shared key for all); read "
        "again when they change. With none, every command is dead-lettered unknown_kid.",
    )
    revoked_kids: Path | None = Field(
        default=None,
        description="A file of revoked key ids, one a line, read again when it changes: "
        "their commands are answered rejected revoked_kid.",
    )
    report_key_file: Path | None = Field(
        default=None,
        description="The node's report key, given at enrolment (warden cluster report-key): "
        "every report is signed with it. Default <agent state dir>/report.key; with no "
        "file the reports go unsigned and a collector that requires MACs refuses them.")
    bootstrap_token_file: Path | None = Field(
        default=None,
        description="A node bootstrap token (warden api token --role node): with no report key "
        "yet, the agent enrols itself through the API at AGENT_API_URL and keeps the key it is "
        "handed (agent/enrolment.py).")
    api_url: str = Field(default="", description="The API the agent enrols itself through.")
    command_leeway_s: float = Field(default=30.0, ge=0.0, le=600.0)
    max_command_ttl_s: float = Field(default=300.0, gt=0.0, le=3_600.0)
    command_seq_window: int = Field(
        default=600_000, ge=0, le=2**40,
        description="A command whose seq is below the last accepted one by at most this is "
        "still taken, once: two senders' commands can arrive in the other order than they "
        "took their seqs. The centre's seqs follow its clock in ms where they would lag it "
        "(services/shared/counters.py), so the default is 10 min, beyond any command's life "
        "(AGENT_MAX_COMMAND_TTL_S plus the leeway); 0: strictly increasing.")
    jobs: str = Field(
        default="train,infer",
        description="Comma-separated ML jobs to run as child processes (train, infer), "
        "'' for none (a standby node), or 'sim' for simulated jobs that start no process "
        "(large fleets); 'sim:<jobs>' simulates only those ('sim:' none: a simulated "
        "standby node, whose migrated-in jobs are simulated too); 'kube' for the GPU pods "
        "the Kubernetes API server has bound to this node (AGENT_NODE_ID is its Node name).",
    )
    kubeconfig: str = Field(
        default="",
        description="With AGENT_JOBS=kube: the kubeconfig to read pods with; empty: the "
        "in-cluster service account.",
    )
    pod_resources_socket: str = Field(
        default="/var/lib/kubelet/pod-resources/kubelet.sock",
        description="With AGENT_JOBS=kube: the kubelet's pod-resources socket, asked which "
        "GPUs each pod holds; where it does not exist (or empty) each pod is given the next "
        "free GPU indices in name order, and its job says gpu_mapping in_name_order.",
    )
    # NoDecode: the env value is a comma-separated list of condition types, not JSON.
    node_fault_conditions: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(DEFAULT_FAULTY),
        description="With AGENT_JOBS=kube: the Node conditions that are fault data while "
        "True (comma-separated; node-problem-detector's by default), beside Ready not True.",
    )
    not_ready_after_s: float = Field(
        default=30.0, ge=0.0, le=3_600.0,
        description="With AGENT_JOBS=kube: a Node Ready False or Unknown this long is fault "
        "data (a joining node is NotReady while its network comes up).",
    )
    # One directory every node of the fleet reads and writes: migrate_job exports a job's
    # checkpoint there, start_job on the next node resumes from it.
    checkpoint_store: Path | None = Field(
        default=None,
        description="The shared checkpoint store (each cluster's jobs in a directory of their "
        "own); default <WARDEN_STATE_DIR>/checkpoints.",
    )
    hung_after_s: float = Field(
        default=30.0, gt=0.0, le=3_600.0, description="A job without progress this long is hung."
    )
    checkpoint_every_s: float = Field(default=5.0, gt=0.0, le=3_600.0)
    job_stop_timeout_s: float = Field(
        default=5.0, gt=0.0, le=300.0, description="SIGTERM to SIGKILL, when jobs are stopped."
    )
    probe_port: int = Field(
        default=0, ge=0, le=65_535, description="Peer-probe echo port; 0: any free one."
    )
    probe_host: str = Field(
        default="127.0.0.1", min_length=1, max_length=253,
        description="The address the peer-probe listener binds to (0.0.0.0: every one).")
    probe_advertise: str = Field(
        default="", max_length=253,
        description="The host peers are told to probe (the report's probe_address); empty: "
        "the bound host, which must then not be a wildcard.")
    peer_probes: int = Field(default=3, ge=0, le=16, description="Peers probed per round.")
    probe_timeout_s: float = Field(default=1.0, gt=0.0, le=30.0)
    models: str = Field(
        default="",
        description="Comma-separated ML models to serve for routed tasks, as name@version "
        "from agent/ml/serving.py's catalogue (e.g. digits-mlp@1,digits-knn@1); '' none.",
    )
    model_max_concurrency: int = Field(
        default=4, ge=1, le=1_024, description="Tasks each served model runs at once.")

    @model_validator(mode="after")
    def _advertised_host(self) -> AgentSettings:
        host = self.advertised_probe_host()
        # Checked as a whole address (any valid port): what peers will be told to connect to;
        # an IPv6 host goes in brackets there.
        check_probe_address(f"[{host}]:1" if ":" in host else f"{host}:1")
        return self

    def advertised_probe_host(self) -> str:
        """The host peers probe: the advertised one, else the bound one."""
        return self.probe_advertise or self.probe_host

    @field_validator("models")
    @classmethod
    def _known_models(cls, value: str) -> str:
        from agent.ml.serving import parse_models

        return ",".join(parse_models(value))

    def model_names(self) -> tuple[str, ...]:
        """The models this node serves (name@version), each once."""
        return tuple(name for name in self.models.split(",") if name)

    @field_validator("jobs")
    @classmethod
    def _known_jobs(cls, value: str) -> str:
        text = value.strip()
        simulated = text.startswith(SIMULATED_PREFIX)
        if simulated:
            text = text.removeprefix(SIMULATED_PREFIX)
        names = [part.strip() for part in text.split(",") if part.strip()]
        if names == [SIMULATED_JOBS] and not simulated:
            return SIMULATED_JOBS
        if names == [KUBE_PODS] and not simulated:
            return KUBE_PODS
        unknown = sorted(set(names) - set(JOB_NAMES))
        if unknown:
            raise ValueError(
                f"unknown jobs {unknown}; expected some of {JOB_NAMES}, 'sim' or 'sim:<jobs>'"
            )
        # Each job once, in a fixed order: the job ids are derived from the names.
        listed = ",".join(name for name in JOB_NAMES if name in names)
        return f"{SIMULATED_PREFIX}{listed}" if simulated else listed

    @property
    def kube_pods(self) -> bool:
        """Whether the node's jobs are the pods the Kubernetes API server bound to it."""
        return self.jobs == KUBE_PODS

    @property
    def simulated(self) -> bool:
        """Whether the node's jobs are simulated (no processes)."""
        return self.jobs == SIMULATED_JOBS or self.jobs.startswith(SIMULATED_PREFIX)

    def job_names(self) -> list[str]:
        """The ML jobs to run as processes (empty for simulated jobs and for none)."""
        if self.simulated or self.kube_pods:
            return []
        return [name for name in self.jobs.split(",") if name]

    def simulated_job_names(self) -> list[str]:
        """The ML jobs to simulate ('sim' is every job; empty when jobs are processes)."""
        if self.jobs == SIMULATED_JOBS:
            return list(JOB_NAMES)
        if not self.simulated:
            return []
        return [name for name in self.jobs.removeprefix(SIMULATED_PREFIX).split(",") if name]

    @field_validator("node_fault_conditions", mode="before")
    @classmethod
    def _split_conditions(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("trusted_keys", mode="before")
    @classmethod
    def _split_paths(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [Path(part.strip()) for part in value.split(",") if part.strip()]
        return value

    def node_state_dir(self) -> Path:
        """Where this agent keeps its journal and fault plan (its last command seq, its
        epochs): under its cluster, since another cluster may have a node of the same name."""
        if self.agent_state_dir is not None:
            return self.agent_state_dir
        return Path(self.state_dir) / "agents" / self.cluster_id / self.node_id

    def report_key_path(self) -> Path:
        """Where the node's report key is (see report_key_file)."""
        if self.report_key_file is not None:
            return self.report_key_file
        return self.node_state_dir() / NODE_KEY_FILE

    def checkpoint_store_dir(self) -> Path:
        """The shared checkpoint store."""
        if self.checkpoint_store is not None:
            return self.checkpoint_store
        return Path(self.state_dir) / CHECKPOINTS_DIR

    def service_name(self) -> str:
        """The agent's service name (client id, consumer group, telemetry)."""
        # The cluster id is part of it: two local clusters may both have a node-001, and a
        # shared consumer group would split one node's commands between two agents.
        return f"agent-{self.cluster_id}-{self.node_id}"
