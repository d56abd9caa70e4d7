"""The agent's FastStream app: wiring only (command subscriber, report loop, lifecycle)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from faststream import FastStream
from faststream.kafka import KafkaBroker
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Tracer

from agent.actions import JobActions
from agent.commands import CommandExecutor
from agent.device import GpuProbe, NvmlProbe, open_probe
from agent.enrolment import enrol_if_needed
from agent.faults import FaultPlan, read_faults, reports_paused
from agent.host import HostSampler
from agent.jobs.kube_node import ConditionRule
from agent.jobs.kube_pods import KubePods
from agent.jobs.pod_resources import PodResourcesClient
from agent.jobs.processes import JobManager, job_args, job_specs
from agent.jobs.runner import JobRunner, JobSource
from agent.jobs.simulated import SimulatedJobs
from agent.journal import Journal
from agent.ml.serving import ModelServer
from agent.peers import EchoListener, PeerProber
from agent.report import Reporter, load_report_key
from agent.settings import AgentSettings
from agent.store import CheckpointStore
from common.errors import InfrastructureUnavailable
from common.health.policy import Phase
from common.health.service import ServiceHealth
from common.kafka_access import client_options
from common.messaging import EventBus, ensure_topics, make_broker, subscribe
from common.metrics import AGENT_COMMANDS, AGENT_REPORTS, instruments
from common.reportauth import NodeReportKey
from common.signing import verifier_from_files
from common.telemetry import setup_telemetry, shutdown_telemetry
from schemas.events.v1 import Command, CommandResult, now_utc
from schemas.topics import Topic

log = logging.getLogger("clusterwarden.agent")
URGENT_POLL_S = 0.25
# How often the jobs are brought in line with the mode and the fault plan between reports:
# a job a failed migration let go restarts in seconds, not at a report an hour away.
JOB_TICK_S = 0.5

# docs/reliability.md §Command verification, step 1: checked before parsing.
COMMAND_LIMIT_BYTES = 16_384


def make_jobs(settings: AgentSettings, state_dir: Path,
              gpu_uuids: Sequence[str] = ()) -> JobRunner | KubePods:
    """The node's jobs as the settings choose them: processes, a simulation, none, or the
    GPU pods the Kubernetes API server bound to this node (which of the node's GPUs, by
    `gpu_uuids`, each holds: from the kubelet's pod-resources socket where it exists)."""
    if settings.kube_pods:
        kubelet = settings.pod_resources_socket
        return KubePods(settings.node_id, settings.gpus, settings.kubeconfig or None,
                        ConditionRule(tuple(settings.node_fault_conditions),
                                      settings.not_ready_after_s),
                        pod_resources=PodResourcesClient(kubelet) if kubelet else None,
                        gpu_uuids=gpu_uuids)
    if settings.simulated:
        return SimulatedJobs(settings.node_id, settings.gpus, now_utc(),
                             names=settings.simulated_job_names(), state_dir=state_dir)
    specs = job_specs(settings.node_id, settings.gpus, settings.job_names(),
                      checkpoint_every_s=settings.checkpoint_every_s)
    return JobManager(specs, state_dir, hung_after_s=settings.hung_after_s,
                      stop_timeout_s=settings.job_stop_timeout_s,
                      args_by_kind=job_args(settings.checkpoint_every_s))


class Agent:
    """One node's agent: owns its journal, probes and the report loop."""

    def __init__(
        self, settings: AgentSettings, broker: KafkaBroker, bus: EventBus, tracer: Tracer
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.bus = bus
        self.tracer = tracer
        self.state_dir: Path = settings.node_state_dir()
        self._journal: Journal | None = None
        self._probe: GpuProbe | None = None
        self._executor: CommandExecutor | None = None
        self._reporter: Reporter | None = None
        self._jobs: JobSource | None = None
        self.models = ModelServer(settings.model_names(), settings.model_max_concurrency)
        self._load_task: asyncio.Task[None] | None = None
        self._listener = EchoListener(self.state_dir, settings.probe_port, settings.probe_host,
                                      settings.probe_advertise, cut_off=self._cut_off)
        self._peers = PeerProber(settings.node_id, self.state_dir.parent,
                                 count=settings.peer_probes, timeout_s=settings.probe_timeout_s,
                                 cut_off=self._cut_off)
        self._stop = asyncio.Event()
        # Set on stop and after every command, so a changed interval takes effect at once.
        self._wake = asyncio.Event()
        self._reported_plan = FaultPlan()
        self._loop_task: asyncio.Task[None] | None = None
        self._probe_task: asyncio.Task[object] | None = None
        self._tend_task: asyncio.Task[None] | None = None
        self._report_key: NodeReportKey | None = None

    # ------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Open the journal and the probes (idempotent)."""
        if self._journal is not None:
            return
        settings = self.settings
        self.state_dir.mkdir(parents=True, exist_ok=True)
        journal = self._journal = Journal.open(self.state_dir)
        if not settings.trusted_keys:
            log.warning("no trusted keys: every command will be rejected (unknown_kid)")
        self._report_key = load_report_key(settings)
        verifier = verifier_from_files(list(settings.trusted_keys), settings.revoked_kids)
        # Seeded by the node's name, so a node's simulated GPUs look the same every run.
        seed = zlib.crc32(f"{settings.cluster_id}/{settings.node_id}".encode())
        probe = self._probe = open_probe(settings.gpus, seed=seed)
        jobs = self._jobs = make_jobs(settings, self.state_dir, probe.uuids)
        store = CheckpointStore(settings.checkpoint_store_dir(), settings.cluster_id)
        self._executor = CommandExecutor(
            settings.node_id,
            settings.cluster_id,
            verifier,
            journal,
            leeway_s=settings.command_leeway_s,
            max_ttl_s=settings.max_command_ttl_s,
            seq_window=settings.command_seq_window,
            fault_plan=lambda: read_faults(self.state_dir),
            default_interval_s=settings.interval_s,
            # A Kubernetes node's pods are moved through the cluster's backend, never by its
            # agent: job actions answer not_supported there.
            jobs=None if isinstance(jobs, KubePods) else JobActions(
                settings.node_id, settings.gpus, jobs, store,
                stop_timeout_s=settings.job_stop_timeout_s),
            models=self.models,
            publish=self._publish_later,
            set_peers=self._peers.assign,
        )
        self._reporter = Reporter(
            node_id=settings.node_id,
            cluster_id=settings.cluster_id,
            pool=settings.pool,
            interval_s=settings.interval_s,
            probe=probe,
            host=HostSampler(),
            journal=journal,
            jobs=jobs,
            peer_probes=self._peers.latest,
            probe_address=self._listener.advertised,
            models=self.models.served,
            max_bytes=settings.max_message_bytes,
        )
        jobs.reconcile(journal.mode, read_faults(self.state_dir))
        log.info("agent %s (cluster %s, pool %s): state in %s, mode %s, interval %.3g s, "
                 "jobs %r, checkpoint store %s", settings.node_id, settings.cluster_id,
                 settings.pool, self.state_dir, journal.mode, self._reporter.interval_s,
                 settings.jobs, store.root / store.cluster)

    def _cut_off(self) -> bool:
        """The fault plan's partition from the node's peers."""
        return read_faults(self.state_dir).partitioned

    @property
    def interval_s(self) -> float:
        """The report interval in force (the centre may have changed it)."""
        if self._reporter is None:
            return self.settings.interval_s
        return self._reporter.interval_s

    async def open_local(self) -> None:
        """Enrol the node if it has a bootstrap token and no key yet, open local state and
        start answering peer probes (nothing here needs Kafka)."""
        if self._journal is None:
            await enrol_if_needed(self.settings)
        self.open()
        await self._listener.start()

    async def startup(self) -> None:
        """Open local state and answer peers, then make sure every topic exists."""
        # Before Kafka: a node whose broker link is down still answers its peers.
        await self.open_local()
        await ensure_topics(self.settings.kafka_bootstrap_servers, self.settings.namespace,
                            security=client_options(self.settings))

    async def start_reporting(self) -> None:
        """Start the report loop once the broker is connected (and train the served models,
        off the loop: reports say `loading` until each is ready)."""
        self._stop.clear()
        if self.models.names and self._load_task is None:
            self._load_task = asyncio.create_task(asyncio.to_thread(self.models.load),
                                                  name="agent-models")
        self._loop_task = asyncio.create_task(self.report_loop(), name="agent-reports")
        self._tend_task = asyncio.create_task(self.tend_jobs(), name="agent-jobs")

    async def stop_reporting(self) -> None:
        """Stop the report loop (and the long actions, which answer) before the broker closes."""
        self._stop.set()
        self._wake.set()
        if self._executor is not None:
            # A migration under way ends as failed "interrupted" and its job stays here; its
            # answer goes out while the broker still can take it.
            await self._executor.shutdown()
        tending, self._tend_task = self._tend_task, None
        if tending is not None:
            tending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await tending
        loading, self._load_task = self._load_task, None
        if loading is not None and not loading.done():
            # The training thread cannot be interrupted; it ends on its own (seconds).
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(loading), timeout=30.0)
        probing, self._probe_task = self._probe_task, None
        if probing is not None:
            probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probing
        task, self._loop_task = self._loop_task, None
        if task is None:
            return
        # A report stuck on an unreachable broker is abandoned, not waited for forever.
        done, _ = await asyncio.wait({task}, timeout=min(self.interval_s, 10.0) + 10.0)
        if not done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self) -> None:
        """Stop the jobs and the listener, release the probe and the journal."""
        if self._executor is not None:
            await self._executor.shutdown()  # no-op after stop_reporting
        if self._jobs is not None:
            # SIGTERM, a checkpoint, an exit: seconds of blocking waits, kept off the loop.
            await asyncio.to_thread(self._jobs.close)
            self._jobs = None
        await self._listener.close()
        if self._probe is not None:
            self._probe.close()
            self._probe = None
        if self._executor is not None:
            self._executor.close()
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    # ------------------------------------------------------------ commands

    async def on_command(self, command: Command) -> None:
        """Verify and execute a command, then publish its result (if it was ours); one for
        this node is a span of the command's trace, so the task's trace shows what the node
        did (every agent reads every command: the others' would bury it)."""
        if command.subject != self.settings.node_id:
            await self._on_command(command)
            return
        with self.tracer.start_as_current_span("agent.command", attributes={
                "node.id": self.settings.node_id, "cluster.id": self.settings.cluster_id,
                "command.event_id": str(command.event_id)}):
            await self._on_command(command)

    async def _on_command(self, command: Command) -> None:
        if self._executor is None:
            raise InfrastructureUnavailable("the agent is not started")
        plan = read_faults(self.state_dir)
        if plan.ignore_commands:
            # The fault "reports, but no longer answers": nothing is journaled or answered.
            log.warning("fault plan: ignoring a command for %s", command.subject)
            return
        try:
            result = self._executor.handle(command, now_utc())
        except sqlite3.Error as err:
            # The journal is the replay protection: without it nothing may run, and the
            # command must come back rather than be committed.
            raise InfrastructureUnavailable(f"command journal: {err}") from err
        if result is None:
            return
        trace.get_current_span().set_attributes(result_attributes(result))
        if self._jobs is not None and self._journal is not None:
            # A drain or offline stops jobs now rather than at the next report.
            self._jobs.reconcile(self._journal.mode, plan)
        self._wake.set()
        await self._answer(result)

    async def _answer(self, result: CommandResult) -> None:
        """Publish an answer sealed with the node's report key: what acts on answers (the
        executor, the router, the collector's probes) reads only its node's own."""
        key = self._report_key
        with self.tracer.start_as_current_span("agent.result", kind=SpanKind.PRODUCER,
                                               attributes={
                "node.id": self.settings.node_id, "cluster.id": self.settings.cluster_id,
                **result_attributes(result)}):
            await self.bus.publish_sealed(Topic.NODE_COMMAND_RESULTS, result,
                                          None if key is None else key.headers)
            instruments().counter(AGENT_COMMANDS).add(
                1, {"action": result.action or "unknown", "outcome": result.outcome})

    async def _publish_later(self, result: CommandResult) -> None:
        """Publish the result of a long action that just ended."""
        if self._jobs is not None and self._journal is not None:
            # A job migrated away or let go: the processes follow at once.
            self._jobs.reconcile(self._journal.mode, read_faults(self.state_dir))
        self._wake.set()
        await self._answer(result)

    async def tend_jobs(self) -> None:
        """Keep the jobs in line with the mode and the fault plan between reports."""
        while not self._stop.is_set():
            if self._jobs is not None and self._journal is not None:
                try:
                    self._jobs.reconcile(self._journal.mode, read_faults(self.state_dir))
                except Exception:
                    log.exception("tending the jobs failed")
            if await self._pause(JOB_TICK_S):
                return

    # ------------------------------------------------------------ reports

    async def _pause(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True if the agent is stopping."""
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=seconds)
        return self._stop.is_set()

    async def _next_tick(self, started: float) -> Literal["stop", "due", "urgent"]:
        """Wait until one interval after `started`, or less if a fatal GPU event arrives."""
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            # Recomputed after every wake-up: a new interval counts from this tick's start.
            remaining = self.interval_s - (loop.time() - started)
            if remaining <= 0:
                return "due"
            if self._urgent():
                return "urgent"
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                # Short slices, so a new XID is reported within a fraction of a second.
                await asyncio.wait_for(self._wake.wait(), timeout=min(remaining, URGENT_POLL_S))
        return "stop"

    def _urgent(self) -> bool:
        """A GPU fault the centre has not been told about yet: report now, not next interval.

        The offline need wants two consecutive faulty reports; sending the first at once
        lets the second (the regular one) follow within one report interval of the fault.
        """
        if isinstance(self._probe, NvmlProbe) and self._probe.has_urgent_events():
            return True
        plan = read_faults(self.state_dir)
        told = self._reported_plan
        return bool(set(plan.xid) - set(told.xid)) or plan.ecc_uncorrected > told.ecc_uncorrected

    def _probe_peers(self) -> None:
        """Start a round of peer probes unless one is still under way (reports never wait)."""
        if self.settings.peer_probes and (self._probe_task is None or self._probe_task.done()):
            self._probe_task = asyncio.create_task(self._peers.probe_round(), name="peer-probes")

    async def report_loop(self) -> None:
        """Publish a report every interval until stopped (unless the fault plan pauses them)."""
        loop = asyncio.get_running_loop()
        was_silent = False
        jobs_started = False
        while not self._stop.is_set():
            started = loop.time()
            plan = read_faults(self.state_dir)
            self._probe_peers()
            silent = reports_paused(plan, now_utc())
            if silent != was_silent:
                log.warning("fault plan: reports %s", "stopped" if silent else "resumed")
                was_silent = silent
            if silent:
                if self._jobs is not None and self._journal is not None:
                    self._jobs.reconcile(self._journal.mode, plan)
            else:
                try:
                    await self.report_once(plan)
                except Exception:
                    # A failed publish (Kafka down) must not end the heartbeat for good.
                    log.exception("publishing the report failed")
            if not jobs_started and self._jobs is not None:
                # Only after the first report: starting processes must not delay the heartbeat.
                self._jobs.start()
                jobs_started = True
            while True:
                woke = await self._next_tick(started)
                if woke == "stop":
                    return
                if woke == "due":
                    break
                # An extra report now; the regular one still comes at its time, so a fault's
                # second report follows within one interval of it.
                try:
                    await self.report_once(read_faults(self.state_dir))
                except Exception:
                    log.exception("publishing the urgent report failed")

    async def report_once(self, plan: FaultPlan) -> None:
        """Build and publish one report inside its own span (trace context goes to Kafka)."""
        if self._reporter is None:
            return
        with self.tracer.start_as_current_span(
            "agent.report",
            kind=SpanKind.PRODUCER,
            attributes={"node.id": self.settings.node_id, "cluster.id": self.settings.cluster_id},
        ) as span:
            if plan.slow_s and await self._pause(plan.slow_s):
                return
            report = self._reporter.build(now_utc(), plan)
            self._reported_plan = plan
            span.set_attribute("report.seq", report.seq)
            span.set_attribute("report.faults", len(report.faults))
            key = self._report_key
            await self.bus.publish_sealed(Topic.NODE_REPORTS, report,
                                          None if key is None else key.headers)
            instruments().counter(AGENT_REPORTS).add(1)


def result_attributes(result: CommandResult) -> dict[str, str | int | bool]:
    """What a command's execution and its answer say in their spans."""
    attributes: dict[str, str | int | bool] = {
        "command.id": str(result.command_id), "command.outcome": result.outcome,
        "command.duplicate": result.duplicate}
    if result.action is not None:
        attributes["command.action"] = result.action
    if result.task_id is not None:
        attributes["task.id"] = str(result.task_id)
    if result.step_index is not None:
        attributes["step.index"] = result.step_index
    if result.reason:
        attributes["command.reason"] = result.reason
    return attributes


def create_agent(settings: AgentSettings | None = None) -> Agent:
    """The agent with its broker and command subscriber wired (nothing is opened yet)."""
    settings = settings if settings is not None else AgentSettings()
    service = settings.service_name()
    telemetry = setup_telemetry("agent")
    broker, _ = make_broker(settings, service, telemetry)
    agent = Agent(settings, broker, EventBus(broker, settings.namespace),
                  telemetry.tracer("clusterwarden.agent"))

    async def on_command(command: Command) -> None:
        await agent.on_command(command)

    subscribe(broker, settings, Topic.NODE_COMMANDS, service, on_command,
              limit=COMMAND_LIMIT_BYTES)
    return agent


def create_app(settings: AgentSettings | None = None) -> FastStream:
    """The agent app; settings come from the environment unless given."""
    agent = create_agent(settings)
    # /livez and /readyz on WARDEN_HEALTH_PORT, as every service answers them: ready while
    # the broker answers and the agent reports.
    health = ServiceHealth(agent.broker, agent.settings)

    async def open_health() -> None:
        await health.open()

    async def running() -> None:
        health.phase = Phase.RUNNING

    async def stopping() -> None:
        health.phase = Phase.STOPPING

    async def flush_telemetry() -> None:
        shutdown_telemetry()
        await health.close()

    return FastStream(
        agent.broker,
        on_startup=[open_health, agent.startup],
        after_startup=[agent.start_reporting, running],
        on_shutdown=[stopping, agent.stop_reporting],
        after_shutdown=[agent.close, flush_telemetry],
    )
