"""An in-process fleet of simulated nodes that speaks the real protocol.

Each simulated node publishes strict `NodeReport`s (keyed by node id, increasing `seq`,
`occurred_at` = now, `gpu_source="simulated"`) through one idempotent producer, every
`interval_s`, the fleet spread evenly over the interval. It answers the centre's signed
`probe_node` commands (verified with the centre's public key), so the collector's two-way
detection sees a healthy node as healthy and a silenced one as dead.

There are no agent processes: a node is a few fields in a dict, so thousands of them fit on
a 2-core machine next to the broker, Redis and the services. Per-node controls:
`set_load`, `add_fault` / `clear_faults`, `silence` / `revive`.

Jobs are only listed (`set_jobs`: what a node reports running, e.g. a whole-node gang job);
they neither run nor move. It does not simulate peer probes, nor any command other than
`probe_node` (answered `failed`, so the centre does not wait for them). Use real agents
(agent/fleet.py) for those.

`python -m bench.fleet_sim --nodes 2000` runs the fleet alone against the broker (no
services) and prints what it costs; bench/trace_replay/ drives it from real traces.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal
from uuid import uuid4

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import RecordMetadata
from pydantic import ValidationError

from common.errors import PermanentError
from common.messaging import all_topic_names, ensure_topics, parse_event
from common.reportauth import enrol_key
from common.signing import CommandVerifier
from schemas.envelope import short_text
from schemas.events.v1 import (
    Command,
    CommandResult,
    Fault,
    GpuMetrics,
    HostMetrics,
    JobInfo,
    NodeMode,
    NodeReport,
    ProbeNode,
    now_utc,
)
from schemas.topics import Topic, topic_name
from services.shared.redis_client import connect_redis

log = logging.getLogger("clusterwarden.bench.fleet_sim")

SOURCE = "fleet-sim"
GPU_MEMORY_MIB = 81_920
HOST_MEMORY_MIB = 524_288
MAX_MESSAGE_BYTES = 65_536
# A slot is the group of nodes that report together. About 50 slots a second keeps the
# stream smooth for the collector without waking the loop more often than needed.
SLOT_TARGET_S = 0.02


@dataclass
class ActiveFault:
    """A fault a node keeps reporting, for `reports_left` more reports (None: until cleared)."""

    fault: Fault
    reports_left: int | None = None
    tag: str | None = None


@dataclass
class SimNode:
    """One simulated node: what its next report will say."""

    node_id: str
    load_pct: float = 0.0
    faults: list[ActiveFault] = field(default_factory=list)
    silent: bool = False
    seq: int = 0
    mode: NodeMode = "active"
    jobs: list[JobInfo] = field(default_factory=list)


@dataclass(frozen=True)
class FaultyReport:
    """A sent report that carried tagged faults: how a need is traced back to an injection."""

    node_id: str
    event_id: str
    sent_at: float  # epoch seconds
    tags: tuple[str, ...]


@dataclass
class FleetStats:
    """What the simulator did, to judge whether it kept up with its own schedule."""

    reports_sent: int = 0
    probes_answered: int = 0
    commands_refused: int = 0
    commands_unverified: int = 0
    max_lag_s: float = 0.0
    late_slots: int = 0


def gpu_metrics(node: SimNode, index: int) -> GpuMetrics:
    """One simulated GPU: utilisation is the node's load; the rest follow from it.

    Memory, temperature and power move with the load so that the figures look like a GPU's,
    not constants; the shapes are plausible, not measured. Faults on this GPU show in its
    counters as the agent shows them (XIDs in `xid_events`, ECC faults as uncorrected errors).
    """
    load = min(max(node.load_pct, 0.0), 100.0)
    on_gpu = [a.fault for a in node.faults if a.fault.gpu_index == index]
    return GpuMetrics(
        index=index,
        uuid=short_text(f"GPU-SIM-{node.node_id}-{index}"),
        name="Simulated GPU",
        utilization_pct=round(load, 3),
        memory_used_mib=int(GPU_MEMORY_MIB * (0.05 + 0.85 * load / 100.0)),
        memory_total_mib=GPU_MEMORY_MIB,
        temperature_c=round(32.0 + 0.45 * load, 1),
        power_w=round(60.0 + 2.9 * load, 1),
        ecc_uncorrected_volatile=sum(1 for f in on_gpu if f.kind == "ecc"),
        xid_events=[f.code for f in on_gpu if f.kind == "xid" and f.code is not None][:64],
    )


def build_report(node: SimNode, cluster: str, pool: str, interval_s: float, gpus: int,
                 now: datetime) -> NodeReport:
    """The node's next report, validated by the real model (strict): seq must already be set."""
    load = min(max(node.load_pct, 0.0), 100.0)
    return NodeReport(
        event_id=uuid4(),
        source=SOURCE,
        occurred_at=now,
        cluster_id=cluster,
        subject=node.node_id,
        node_id=node.node_id,
        pool=pool,
        seq=node.seq,
        interval_s=interval_s,
        gpu_source="simulated",
        mode=node.mode,
        gpus=[gpu_metrics(node, i) for i in range(gpus)],
        host=HostMetrics(cpu_pct=round(min(100.0, 4.0 + 0.3 * load), 1),
                         memory_used_mib=int(HOST_MEMORY_MIB * (0.1 + 0.5 * load / 100.0)),
                         memory_total_mib=HOST_MEMORY_MIB, disk_used_pct=40.0),
        faults=[a.fault for a in node.faults][:256],
        jobs=node.jobs[:1024],
    )


def consume_faults(node: SimNode) -> tuple[str, ...]:
    """After a report: count down the faults that last a number of reports; returns the tags
    the report carried."""
    tags = tuple(a.tag for a in node.faults if a.tag is not None)
    kept: list[ActiveFault] = []
    for active in node.faults:
        if active.reports_left is not None:
            active.reports_left -= 1
            if active.reports_left <= 0:
                continue
        kept.append(active)
    node.faults = kept
    return tags


def slot_count(nodes: int, interval_s: float, target_s: float = SLOT_TARGET_S) -> int:
    """How many groups the fleet reports in per interval (at least 1, at most one per node)."""
    return max(1, min(nodes, math.ceil(interval_s / target_s)))


def slot_members(nodes: int, slots: int, slot: int) -> range:
    """Indices of the nodes that report in `slot`: interleaved, so each slot is a sample."""
    return range(slot, nodes, slots)


class FleetSim:
    """N simulated nodes reporting through one idempotent producer; see the module doc."""

    def __init__(
        self,
        bootstrap: str,
        namespace: str,
        cluster: str,
        node_ids: Sequence[str],
        *,
        interval_s: float,
        gpus_per_node: int = 1,
        pool: str = "default",
        verifier: CommandVerifier | None = None,
        load_pct: float = 0.0,
        report_master: bytes | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        if len(set(node_ids)) != len(node_ids):
            raise ValueError("node ids must be unique")
        self.bootstrap = bootstrap
        self.namespace = namespace
        self.cluster = cluster
        self.interval_s = interval_s
        self.gpus = gpus_per_node
        self.pool = pool
        # Without the centre's public key nothing can be checked, so nothing is answered:
        # a simulator that obeyed unsigned commands would test a weaker protocol than the real.
        self.verifier = verifier
        # Each node signs its reports as a real agent does, with the key enrolment gives it
        # (derived from the collector's master); without one the reports go unsigned.
        self.report_keys = ({n: enrol_key(report_master, cluster, n) for n in node_ids}
                            if report_master is not None else {})
        self.order = list(node_ids)
        self.nodes = {n: SimNode(n, load_pct=load_pct) for n in node_ids}
        self.stats = FleetStats()
        self.faulty_reports: dict[str, FaultyReport] = {}
        self.first_sent: dict[str, float] = {}  # tag -> when its first report was sent
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------ controls

    def set_load(self, node: str, pct: float) -> None:
        """The node's GPU utilisation (all its GPUs), %, from its next report on."""
        self.nodes[node].load_pct = min(max(pct, 0.0), 100.0)

    def set_jobs(self, node: str, jobs: Sequence[JobInfo]) -> None:
        """The jobs the node reports running, from its next report on."""
        self.nodes[node].jobs = list(jobs)

    def add_fault(self, node: str, fault: Fault, reports: int | None = None,
                  tag: str | None = None) -> None:
        """Report `fault` from the next report on, for `reports` reports (None: until cleared).

        `tag` names the injection: reports carrying it are kept in `faulty_reports`, so a
        need (whose correlation id is the report's event id) can be traced back to it.
        """
        if reports is not None and reports < 1:
            raise ValueError("reports must be at least 1")
        self.nodes[node].faults.append(ActiveFault(fault, reports, tag))

    def clear_faults(self, node: str) -> None:
        """The node reports no fault from its next report on (a repair)."""
        self.nodes[node].faults.clear()

    def silence(self, node: str) -> None:
        """The node stops reporting and answering, as a dead agent does."""
        self.nodes[node].silent = True

    def revive(self, node: str) -> None:
        """The node reports again, continuing its sequence."""
        self.nodes[node].silent = False

    def loads(self) -> Iterable[float]:
        """The GPU utilisation of every reporting node (what the pool's mean should be)."""
        return (n.load_pct for n in self.nodes.values() if not n.silent)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        # Created here, not in __init__: aiokafka clients must be made inside the loop.
        producer = self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, client_id="fleet-sim", enable_idempotence=True,
            acks="all", linger_ms=5, request_timeout_ms=15_000)
        await producer.start()
        self._tasks.append(asyncio.create_task(self._report_loop(producer),
                                               name="fleet-reports"))
        if self.verifier is not None:
            consumer = self._consumer = AIOKafkaConsumer(
                topic_name(Topic.NODE_COMMANDS, self.namespace),
                bootstrap_servers=self.bootstrap, auto_offset_reset="earliest",
                enable_auto_commit=False)
            await consumer.start()
            self._tasks.append(asyncio.create_task(self._command_loop(consumer, producer),
                                                   name="fleet-commands"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    def check(self) -> None:
        """Raise the error of a loop that died (a simulator that stopped must stop the run)."""
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"{task.get_name()} failed") from task.exception()

    # ------------------------------------------------------------ loops

    async def _report_loop(self, producer: AIOKafkaProducer) -> None:
        """Send each slot's reports on an absolute schedule; a late slot is sent at once."""
        reports = topic_name(Topic.NODE_REPORTS, self.namespace)
        slots = slot_count(len(self.order), self.interval_s)
        period = self.interval_s / slots
        start = time.monotonic()
        pending: list[asyncio.Future[RecordMetadata]] = []
        tick = 0
        while True:
            due = start + tick * period
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                lag = -delay
                self.stats.max_lag_s = max(self.stats.max_lag_s, lag)
                if lag > period:
                    self.stats.late_slots += 1
            sent: list[asyncio.Future[RecordMetadata]] = []
            now = now_utc()
            for index in slot_members(len(self.order), slots, tick % slots):
                node = self.nodes[self.order[index]]
                if not node.silent:
                    sent.append(await self._send(producer, reports, node, now))
            # Acks are awaited one slot later: the producer batches meanwhile, and a broker
            # error still stops the run within a slot.
            if pending:
                await asyncio.gather(*pending)
            pending = sent
            self.stats.reports_sent += len(sent)
            tick += 1

    async def _send(self, producer: AIOKafkaProducer, reports: str, node: SimNode,
                    now: datetime) -> asyncio.Future[RecordMetadata]:
        """Send the node's next report (its seq moves on); answers the pending ack."""
        node.seq += 1
        report = build_report(node, self.cluster, self.pool, self.interval_s, self.gpus, now)
        tags = consume_faults(node)
        sent_at = time.time()
        if tags:
            event_id = str(report.event_id)
            self.faulty_reports[event_id] = FaultyReport(node.node_id, event_id, sent_at, tags)
            for tag in tags:
                self.first_sent.setdefault(tag, sent_at)
        body = report.model_dump_json().encode()
        ack: asyncio.Future[RecordMetadata] = await producer.send(
            reports, body, key=node.node_id.encode(),
            headers=self._headers(node.node_id, body, b"node_report"))
        return ack

    def _headers(self, node: str, body: bytes, event_type: bytes) -> list[tuple[str, bytes]]:
        """What an agent sends with `body`: its type and, with a key, the node's MAC over it
        (reports and command answers alike are read only with it)."""
        headers = [("content-type", b"application/json"), ("event-type", event_type)]
        key = self.report_keys.get(node)
        if key is not None:
            headers += [(name, value.encode()) for name, value in key.headers(body).items()]
        return headers

    async def report_now(self, node: str) -> None:
        """Send the node's report at once, outside its schedule: as an agent reports a new
        XID or uncorrected ECC error the moment it sees it."""
        if self._producer is None:
            raise RuntimeError("the fleet is not started")
        sim = self.nodes[node]
        if not sim.silent:
            await (await self._send(self._producer,
                                    topic_name(Topic.NODE_REPORTS, self.namespace), sim,
                                    now_utc()))

    async def _command_loop(self, consumer: AIOKafkaConsumer,
                            producer: AIOKafkaProducer) -> None:
        results = topic_name(Topic.NODE_COMMAND_RESULTS, self.namespace)
        while True:
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    answer = self.answer(record.value, record.key)
                    if answer is not None:
                        body = answer.model_dump_json().encode()
                        await producer.send(results, body, key=answer.node_id.encode(),
                                            headers=self._headers(answer.node_id, body,
                                                                  b"command_result"))

    def answer(self, body: bytes, key: bytes | None) -> CommandResult | None:
        """The answer to one command, or None: not ours, not verifiable, or the node is dead."""
        assert self.verifier is not None
        try:
            command = parse_event(Command, body, key, MAX_MESSAGE_BYTES)
            authorised = self.verifier.authorise(command)
        except (PermanentError, ValidationError):
            self.stats.commands_unverified += 1
            return None
        if authorised.refusal is not None:  # a signer doing what it may not, or revoked
            self.stats.commands_unverified += 1
            return None
        payload = authorised.payload
        node = self.nodes.get(payload.node_id)
        if node is None or node.silent or payload.cluster_id != self.cluster:
            return None
        now = now_utc()
        if payload.expires_at <= now:
            return None  # the centre has already counted it as unanswered
        outcome: Literal["succeeded", "failed"] = "succeeded"
        reason = ""
        outputs: dict[str, str | int | float | bool] = {}
        if isinstance(payload.action, ProbeNode):
            self.stats.probes_answered += 1
            outputs = {"mode": node.mode, "interval_s": self.interval_s}
        else:
            # An answer, so the centre does not wait for its deadline, and a clear reason.
            self.stats.commands_refused += 1
            outcome, reason = "failed", "not_supported_by_simulator"
        return CommandResult(
            event_id=uuid4(), source=SOURCE, occurred_at=now, cluster_id=self.cluster,
            subject=node.node_id, correlation_id=command.correlation_id,
            command_id=payload.command_id, node_id=node.node_id, task_id=payload.task_id,
            step_index=payload.step_index, action=payload.action.action,
            outcome=outcome, reason=reason, outputs=outputs,
        )


async def drop_namespace(bootstrap: str, redis_url: str | None, namespace: str) -> None:
    """Best effort: drop a run's topics and Redis keys, so a shared broker stays tidy."""
    if redis_url is not None:
        with contextlib.suppress(Exception):
            redis = connect_redis(redis_url)
            try:
                batch: list[bytes] = []
                async for key in redis.scan_iter(match=f"cw:{namespace}:*", count=1000):
                    batch.append(key)
                    if len(batch) >= 1000:
                        await redis.delete(*batch)
                        batch.clear()
                if batch:
                    await redis.delete(*batch)
            finally:
                await redis.aclose()
    with contextlib.suppress(Exception):
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.delete_topics(list(all_topic_names(namespace)))
        finally:
            await admin.close()


async def main() -> None:
    """The fleet alone against the broker: what N simulated nodes cost this process."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2_000)
    parser.add_argument("--interval", type=float, default=1.0, help="Report interval, s.")
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
    namespace = f"fleetsim{uuid4().hex[:6]}"
    # Retried requests (a new topic's leader not elected yet) are not news here.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    # SIGTERM cancels the run, so the producer is closed and the topics dropped.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    await ensure_topics(bootstrap, namespace)
    sim = FleetSim(bootstrap, namespace, "sim", [f"sim-{i:05d}" for i in range(args.nodes)],
                   interval_s=args.interval, load_pct=50.0)
    try:
        await sim.start()
        cpu, wall = time.process_time(), time.monotonic()
        await asyncio.sleep(args.seconds)
        sim.check()
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    finally:
        await sim.stop()
        await drop_namespace(bootstrap, None, namespace)
    print(json.dumps({
        "nodes": args.nodes, "interval_s": args.interval, "seconds": round(wall, 1),
        "reports_per_s": round(sim.stats.reports_sent / wall),
        "cpu_share_of_one_core": round(cpu / wall, 3),
        "cpu_us_per_report": round(1e6 * cpu / max(1, sim.stats.reports_sent), 1),
        "max_lag_s": round(sim.stats.max_lag_s, 3), "late_slots": sim.stats.late_slots,
    }))


if __name__ == "__main__":
    asyncio.run(main())
