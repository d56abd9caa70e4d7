"""Building one NodeReport from the probes, the journal and the fault plan."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Final
from uuid import uuid4

from agent.device import GpuProbe
from agent.faults import (
    FaultPlan,
    faults_for_report,
    gpu_faults,
    inject_into_gpus,
    inject_into_host,
    job_faults,
)
from agent.host import HostSampler
from agent.jobs.kube_pods import KubePods
from agent.jobs.runner import JobSource
from agent.journal import Journal
from agent.settings import AgentSettings
from common.reportauth import NodeReportKey, read_node_key
from schemas.envelope import IDENTIFIER_MAX, short_text
from schemas.events.v1 import (
    Fault,
    GpuMetrics,
    HostMetrics,
    JobInfo,
    NodeReport,
    PeerProbe,
    ServedModel,
)

log = logging.getLogger("clusterwarden.agent.report")

MAX_FAULTS = 256  # the schema's bound on NodeReport.faults
MAX_PEER_PROBES = 16  # the schema's bound on NodeReport.peer_probes
MAX_MODELS = 64  # the schema's bound on NodeReport.models


def no_peers() -> list[PeerProbe]:
    """The peer probes of an agent that probes nobody."""
    return []


def no_models() -> list[ServedModel]:
    """The models of an agent that serves none."""
    return []


def load_report_key(settings: AgentSettings) -> NodeReportKey | None:
    """The node's report key; None (unsigned reports) only if none was configured or given.

    A configured file that is missing, or a key for another node or cluster, stops the agent
    at start: its reports would all be refused, and a wrong file is a mistake to see at once.
    """
    path = settings.report_key_path()
    if not path.exists():
        if settings.report_key_file is not None:
            raise ValueError(f"AGENT_REPORT_KEY_FILE {path} does not exist")
        log.warning("no report key at %s: reports go unsigned, and a collector that requires "
                    "report MACs refuses them (unauthenticated_report)", path)
        return None
    key = read_node_key(path)
    if (key.cluster_id, key.node_id) != (settings.cluster_id, settings.node_id):
        raise ValueError(f"{path} is the report key of {key.cluster_id}/{key.node_id}, not of "
                         f"{settings.cluster_id}/{settings.node_id}")
    return key


class Reporter:
    """Reads everything a report needs; one call to `build` per interval."""

    def __init__(
        self,
        *,
        node_id: str,
        cluster_id: str,
        pool: str,
        interval_s: float,
        probe: GpuProbe,
        host: HostSampler,
        journal: Journal,
        jobs: JobSource,
        peer_probes: Callable[[], list[PeerProbe]] = no_peers,
        probe_address: Callable[[], str | None] = lambda: None,
        models: Callable[[], list[ServedModel]] = no_models,
        max_bytes: int | None = None,
    ) -> None:
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.pool = pool
        self.default_interval_s = interval_s
        self.probe = probe
        self.host = host
        self.journal = journal
        self.jobs = jobs
        self.peer_probes = peer_probes
        self.probe_address = probe_address
        self.models = models
        self.max_bytes = max_bytes
        self.source = f"agent-{node_id}"[:IDENTIFIER_MAX]

    @property
    def interval_s(self) -> float:
        """The report interval in force: the centre's if it set one, else the configured one."""
        journaled = self.journal.interval_s
        return self.default_interval_s if journaled is None else journaled

    def build(self, now: datetime, plan: FaultPlan) -> NodeReport:
        """The report at `now`, with the plan's injected faults applied."""
        mode = self.journal.mode
        faults: list[Fault] = []
        if isinstance(self.jobs, KubePods):
            # On Kubernetes the backend cordons the node and no command reaches its agent:
            # the Node's claim says whether ClusterWarden took it offline. Its conditions
            # (not Ready, a problem detector's) are fault data.
            mode = self.jobs.mode(mode)
            faults.extend(self.jobs.node_faults(now))
        try:
            self.jobs.reconcile(mode, plan)
            jobs = self.jobs.snapshot(now)
        except Exception as err:
            # Like a GPU that cannot be read: fault data, and the heartbeat still goes out.
            log.exception("reading the jobs failed")
            jobs = []
            faults.append(Fault(kind="agent", detail=short_text(f"jobs failed: {err!r}")))
        gpus: list[GpuMetrics]
        try:
            gpus = self.probe.read(jobs, now, load_pct=plan.load_pct)
        except Exception as err:
            # A GPU that cannot be read is itself fault data; the heartbeat must still go out.
            log.exception("reading the GPUs failed")
            gpus = []
            faults.append(Fault(kind="agent", detail=short_text(f"gpu probe failed: {err!r}")))
        try:
            host = self.host.read(now)
        except Exception as err:
            log.exception("reading host metrics failed")
            host = HostMetrics(cpu_pct=0.0, memory_used_mib=0, memory_total_mib=0,
                               disk_used_pct=0.0)
            faults.append(Fault(kind="agent", detail=short_text(f"host metrics failed: {err!r}")))
        host = inject_into_host(plan, host)
        faults.extend(gpu_faults(gpus))
        faults.extend(faults_for_report(plan))
        faults.extend(job_faults(jobs, plan))
        gpus = inject_into_gpus(plan, gpus)
        report = NodeReport(
            event_id=uuid4(),
            source=self.source,
            occurred_at=now,
            cluster_id=self.cluster_id,
            subject=self.node_id,
            node_id=self.node_id,
            pool=self.pool,
            seq=self.journal.next_report_seq(int(now.timestamp() * 1000)),
            interval_s=self.interval_s,
            gpu_source=self.probe.source,
            mode=mode,
            gpus=gpus,
            host=host,
            faults=faults[:MAX_FAULTS],
            jobs=jobs,
            peer_probes=self.peer_probes()[:MAX_PEER_PROBES],
            probe_address=self.probe_address(),
            models=self.models()[:MAX_MODELS],
        )
        return report if self.max_bytes is None else fit_to_limit(report, self.max_bytes)


# Which jobs a report too big for the collector keeps first: what the centre acts on (running
# work it may have to move) before what it only records (stopped or failed jobs).
JOB_KEEP_ORDER: Final[Mapping[str, int]] = MappingProxyType({
    "hung": 0, "running": 1, "checkpointing": 1, "starting": 2, "failed": 3, "stopped": 4})


def report_bytes(report: NodeReport) -> int:
    """The report's size on the wire, as the collector's size check counts it."""
    return len(report.model_dump_json().encode())


def fit_to_limit(report: NodeReport, limit: int) -> NodeReport:
    """`report`, or a copy trimmed to `limit` bytes if it is larger.

    A report over the collector's limit is dead-lettered `oversize` whole: the node would go
    silent, then down, and be taken offline for having too many jobs. So a report that would
    not fit gives up detail instead, in the order the centre needs it least: peer probes (the
    next round sends them again), then jobs by JOB_KEEP_ORDER. The heartbeat, the metrics and
    the faults always go. A warning says what was left out."""
    size = report_bytes(report)
    if size <= limit:
        return report
    trimmed = report.model_copy(update={"peer_probes": []})
    if report_bytes(trimmed) > limit:
        jobs = sorted(report.jobs, key=lambda job: JOB_KEEP_ORDER.get(job.state, 5))
        kept = _jobs_that_fit(trimmed, jobs, limit)
        trimmed = trimmed.model_copy(update={"jobs": jobs[:kept]})
    log.warning("report of %s is %d bytes, over the %d-byte limit: sent %d of %d jobs and %d "
                "of %d peer probes", report.node_id, size, limit, len(trimmed.jobs),
                len(report.jobs), len(trimmed.peer_probes), len(report.peer_probes))
    return trimmed


def _jobs_that_fit(report: NodeReport, jobs: list[JobInfo], limit: int) -> int:
    """The largest n such that `report` with `jobs[:n]` is within `limit` (bisection: a
    report's size grows with every job kept)."""
    low, high = 0, len(jobs)
    while low < high:
        middle = (low + high + 1) // 2
        if report_bytes(report.model_copy(update={"jobs": jobs[:middle]})) <= limit:
            low = middle
        else:
            high = middle - 1
    return low
