"""Collector handlers: validate each report, apply it to node state, publish what changed."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast
from uuid import UUID, uuid4

from aiokafka.structs import ConsumerRecord
from faststream.kafka import KafkaMessage
from opentelemetry import metrics, trace
from pydantic import ValidationError

from common.clock import Clock
from common.crashpoints import crash_point
from common.deadletter import DeadLetterPolicy, classify, records_of
from common.errors import PermanentError
from common.messaging import BulkPublisher, EventBus, parse_event
from common.metrics import COLLECTOR_REPORTS, REPORT_TO_STATE, Instruments
from common.reportauth import UNAUTHENTICATED, WRONG_SENDER, ReportAuthenticator
from common.signing import CommandSigner
from common.tracing import headers_trace, item_span, item_traces_header, span_trace, unpack
from schemas.envelope import short_text
from schemas.events.v1 import (
    Alert,
    CommandPayload,
    CommandResult,
    Fault,
    NodeReport,
    NodeState,
    NodeStateName,
    ProbeNode,
    Sample,
    SetReportInterval,
    now_utc,
    state_from_mode,
)
from schemas.topics import Topic
from services.collector import policy
from services.collector.peers import PeerWatch
from services.collector.settings import CollectorSettings
from services.collector.store import Applied, NodeRow, NodeStore, ProbeStore, epoch_to_datetime

log = logging.getLogger("clusterwarden.collector")
SOURCE = "collector"


@dataclass(frozen=True)
class UsableReport:
    """A report fit for decisions, with what it implies and the Kafka record it came in."""

    report: NodeReport
    state: NodeStateName
    record: ConsumerRecord[Any, Any]
    sample: Sample
    # The report's span in its own trace: its sample and state change go on in it.
    span: trace.Span = trace.INVALID_SPAN

    @property
    def partition(self) -> int:
        """The reports partition it was read from, which its sample keeps (see batch_samples)."""
        return int(self.record.partition)


class Collector:
    """Turns node reports into node state, samples and state transitions."""

    def __init__(
        self,
        settings: CollectorSettings,
        store: NodeStore,
        bus: BulkPublisher,
        dead_letters: DeadLetterPolicy,
        tracer: trace.Tracer,
        meter: metrics.Meter,
        probes: ProbeStore | None = None,
        prober: Prober | None = None,
        clock: Clock = now_utc,
        peers: PeerWatch | None = None,
        authenticator: ReportAuthenticator | None = None,
    ) -> None:
        self.settings = settings
        # None: nothing is checked (unit tests of the state logic); the app always has one.
        self.authenticator = authenticator
        self.clock = clock
        self.probes = probes
        self.prober = prober
        self.peers = peers
        self.store = store
        self.bus = bus
        self.dead_letters = dead_letters
        self.tracer = tracer
        recorded = Instruments(meter)
        self.reports_counter = recorded.counter(COLLECTOR_REPORTS)
        self.state_latency = recorded.histogram(REPORT_TO_STATE)

    async def on_reports(self, bodies: list[bytes], msg: KafkaMessage) -> None:
        """A batch of raw reports: each one is validated on its own, bad ones dead-lettered.

        Each report gets a span of its own trace (the agent's), linked to the batch's: the
        batch's span starts a trace of its own, and everything a report causes must stay in
        the report's."""
        spans: list[trace.Span] = []
        try:
            await self._reports(records_of(msg.raw_message), spans)
        finally:
            for span in spans:
                span.end()

    def _report_span(self, record: ConsumerRecord[Any, Any]) -> trace.Span:
        return item_span(self.tracer, "collector.report", headers_trace(record.headers),
                         kind=trace.SpanKind.CONSUMER,
                         attributes={"messaging.kafka.partition": int(record.partition),
                                     "messaging.kafka.offset": int(record.offset)})

    async def _reports(self, records: Sequence[ConsumerRecord[Any, Any]],
                       spans: list[trace.Span]) -> None:
        now = self.clock()
        usable: list[UsableReport] = []
        outcomes: Counter[str] = Counter()
        for record in records:
            span = self._report_span(record)
            spans.append(span)
            try:
                report = parse_event(
                    NodeReport, record.value or b"", record.key, self.settings.max_message_bytes
                )
            except (PermanentError, ValidationError) as err:
                _, reason, detail = classify(err)
                await self.dead_letters.dead_letter(record, reason, detail)
                outcomes[f"dead_letter:{reason}"] += 1
                span.set_attribute("report.outcome", f"dead_letter:{reason}")
                continue
            span.set_attributes({"node.id": report.node_id, "cluster.id": report.cluster_id,
                                 "report.seq": report.seq, "report.faults": len(report.faults)})
            refusal = self._unauthentic(report, record)
            if refusal is not None:
                # Before anything is read from it: a forged report touches no state.
                await self._refuse(report, record, UNAUTHENTICATED, refusal)
                outcomes[f"dead_letter:{UNAUTHENTICATED}"] += 1
                continue
            verdict = policy.timestamp_verdict(
                report.occurred_at, now, self.settings.future_skew_s, self.settings.stale_after_s
            )
            if verdict != "ok":
                # Kept out of decisions: a skewed clock must never take a node offline.
                log.warning("report %s from %s is %s; not used for decisions",
                            report.event_id, report.node_id, verdict)
                outcomes[verdict] += 1
                span.set_attribute("report.outcome", verdict)
                continue
            if policy.seq_ahead_of_clock(report.seq, now, self.settings.future_skew_s):
                await self._refuse(report, record, "implausible_seq", (
                    f"seq {report.seq} of node {report.node_id!r} is ahead of this "
                    f"collector's clock by more than {self.settings.future_skew_s:g} s: "
                    "not adopted"))
                outcomes["dead_letter:implausible_seq"] += 1
                continue
            usable.append(UsableReport(report, state_from_mode(report.mode), record,
                                       policy.summarize(report, SOURCE, now), span))
        if usable:
            await self.apply(usable, outcomes, now)
        for outcome, count in outcomes.items():
            self.reports_counter.add(count, {"outcome": outcome})

    def _unauthentic(self, report: NodeReport, record: ConsumerRecord[Any, Any]) -> str | None:
        """Why the report is not its node's own (its MAC), or None if it is (or unchecked)."""
        if self.authenticator is None:
            return None
        return self.authenticator.check(report.cluster_id, report.node_id, record.value or b"",
                                        record.headers or (),
                                        required=self.settings.require_report_mac)

    async def _refuse(self, report: NodeReport, record: ConsumerRecord[Any, Any], reason: str,
                      detail: str) -> None:
        """Dead-letters a report that someone may be sending in its node's name, never
        adopting it, and tells a person once a window per node and reason."""
        log.warning("report %s refused: %s", report.event_id, detail)
        await self.dead_letters.dead_letter(record, reason, detail)
        kind = "implausible_report" if reason == "implausible_seq" else reason
        key = f"{reason.replace('_', '-')}.{report.cluster_id}.{report.node_id}"
        if await self.store.first_alert(key, self.settings.bad_input_alert_window_s):
            await self.bus.publish_many(Topic.OPS_ALERTS, [Alert(
                event_id=uuid4(), source=SOURCE, occurred_at=self.clock(),
                cluster_id=report.cluster_id, subject=report.node_id, severity="warning",
                kind=kind, dedup_key=key, message=short_text(detail))])

    async def apply(self, usable: list[UsableReport], outcomes: Counter[str],
                    now: datetime) -> None:
        """Apply valid reports to node state; publish their samples and state transitions."""
        applied = await self.store.apply_reports(
            [(u.report, u.state, u.sample.gpu_utilization_pct) for u in usable],
            self.settings.suspect_after_intervals)
        samples: list[tuple[int, Sample]] = []
        transitions: list[NodeState] = []
        # Each report's trace, for what it causes: its sample (inside a batch) and its state
        # change (a message of its own).
        sample_traces: dict[UUID, str] = {}
        transition_headers: list[dict[str, str]] = []
        cut_off = await self._partitioned(usable, applied, now)
        for u, result in zip(usable, applied, strict=True):
            report, state = u.report, u.state
            outcomes[result.outcome] += 1
            u.span.set_attribute("report.outcome", result.outcome)
            if result.outcome == "unknown":
                # Quarantined, not registered: a node must be enrolled before it counts.
                await self.dead_letters.dead_letter(
                    u.record, "unknown_node",
                    f"node {report.node_id!r} is not registered in cluster {report.cluster_id!r}")
                continue
            if result.outcome == "old":
                continue  # an older report than one already applied: not used for decisions
            sample = u.sample
            if result.failed_probes:
                sample = with_fault(sample, Fault(kind="probe_failed", detail=(
                    f"{result.failed_probes} centre probe(s) in a row unanswered")))
            if u.report.event_id in cut_off:
                sample = with_fault(sample, Fault(kind="partitioned",
                                                  detail=cut_off[u.report.event_id]))
            samples.append((u.partition, sample))
            sample_traces[sample.event_id] = span_trace(u.span)
            if result.previous != state:
                transition_headers.append(unpack(sample_traces[sample.event_id]))
                transitions.append(
                    NodeState(
                        event_id=policy.derived_id("state", report.event_id),
                        source=SOURCE,
                        occurred_at=now,
                        cluster_id=report.cluster_id,
                        subject=report.node_id,
                        correlation_id=str(report.event_id),
                        node_id=report.node_id,
                        pool=report.pool,
                        state=state,
                        previous=result.previous,
                        reason=f"report mode {report.mode}",
                        last_report_at=report.occurred_at,
                    )
                )
        batches = policy.batch_samples(samples, SOURCE, now)
        await self.bus.publish_many(Topic.OPS_SAMPLES, batches, [
            item_traces_header([sample_traces.get(s.event_id, "") for s in batch.samples])
            for batch in batches])
        if self.prober is not None:
            await self.prober.steer_intervals(
                [u.report for u, result in zip(usable, applied, strict=True)
                 if result.outcome == "ok"], now)
        await self.bus.publish_many(Topic.OPS_NODE_STATE, transitions, transition_headers)
        self._record_state_latency(transitions)

    def _record_state_latency(self, transitions: list[NodeState]) -> None:
        """Report to published state change, per change (few: a node's state changes
        rarely, so this costs the report path nothing)."""
        published = self.clock()
        for change in transitions:
            if change.last_report_at is not None:
                self.state_latency.record(
                    max(0.0, (published - change.last_report_at).total_seconds()),
                    {"state": change.state})

    async def _partitioned(self, usable: list[UsableReport], applied: list[Applied],
                           now: datetime) -> dict[UUID, str]:
        """The reports (by event id) whose node its peers find cut off, with why."""
        if self.peers is None:
            return {}
        # A redelivered report (replay) is judged again, so its sample says what it said.
        fresh = [u.report for u, result in zip(usable, applied, strict=True)
                 if result.outcome in ("ok", "replay")]
        if not fresh:
            return {}
        judged = await self.peers.observe(fresh, now)
        quorum = self.peers.quorum
        return {report.event_id: f"{judgement.detail()} (quorum {quorum})"
                for report, judgement in zip(fresh, judged, strict=True)
                if judgement.partitioned(quorum)}

    async def sweep_heartbeats(self) -> None:
        """Nodes that stopped reporting become `suspect`, then `down` after the grace period.

        A silent node its peers still reach is not down: it stays `suspect`, marked
        agent dead, until they no longer reach it.
        """
        interval = self.settings.sweep_interval_s
        if not await self.store.try_lock_sweep("heartbeat", interval * 0.9):
            return  # another collector instance sweeps this tick
        now = self.clock()
        with self.tracer.start_as_current_span("collector.sweep_heartbeats"):
            for cluster in await self.store.clusters():
                changes: list[NodeState] = []
                for row in await self.store.due_nodes(cluster, now, limit=5_000):
                    change = await self._silent(cluster, row, now)
                    if change is not None:
                        changes.append(change)
                if changes:
                    crash_point("collector.after_mark_silent")
                await self.bus.publish_many(Topic.OPS_NODE_STATE, changes)
                await self.store.outbox.delivered(change.event_id for change in changes)

    async def relay_outbox(self) -> None:
        """Publish the state changes a dead collector made and left unannounced."""
        await self.store.outbox.relay(self.bus, self.clock(), self.settings.outbox_grace_s)

    async def _silent(self, cluster: str, row: NodeRow, now: datetime) -> NodeState | None:
        """One silent node's next state, and its state change if there is one."""
        settings = self.settings
        last = epoch_to_datetime(row.last_report_at)
        silence = (now - last).total_seconds()
        state = policy.heartbeat_state(silence, row.interval_s,
                                       settings.suspect_after_intervals, settings.down_after_s)
        next_check = policy.next_heartbeat_check(
            last.timestamp(), row.interval_s, state, settings.suspect_after_intervals,
            settings.down_after_s)
        if state == "up":
            # Not silent long enough (its interval changed): only reschedule.
            state = cast(NodeStateName, row.state)
        reason = f"no report for {silence:.1f}s"
        agent_dead = False
        if state == "down" and self.peers is not None:
            judgement = await self.peers.judge_silent(cluster, row.node_id, last.timestamp(),
                                                      now)
            if judgement.alive(self.peers.quorum):
                # Its peers reach it: the node is alive, its agent is not. Looked at again
                # soon: once they stop reaching it, it is down after all.
                state, agent_dead = "suspect", True
                next_check = now.timestamp() + row.interval_s * settings.suspect_after_intervals
                reason += f"; agent dead: {judgement.detail()}"

        def announcement(previous: NodeStateName) -> NodeState:
            return NodeState(
                event_id=policy.derived_id("silent", cluster, row.node_id, row.last_report_at,
                                           "agent_dead" if agent_dead else state),
                source=SOURCE, occurred_at=now, cluster_id=cluster, subject=row.node_id,
                node_id=row.node_id, pool=row.pool, state=state, previous=previous,
                reason=reason, last_report_at=last, agent_dead=agent_dead,
            )

        # The event is written with the change (the outbox): one for each state it may be in.
        change = await self.store.mark_silent(
            cluster, row, state, next_check,
            {before: announcement(cast(NodeStateName, before))
             for before in policy.HEARTBEAT_TRACKED_STATES}, now)
        if agent_dead and self.peers is not None:
            # Said once per silence, whether or not the state itself changed now.
            first = await self.peers.store.first_agent_death(
                cluster, row.node_id, row.last_report_at, settings.stale_after_s * 6)
            if change is None and first and row.state in policy.HEARTBEAT_TRACKED_STATES:
                change = announcement(cast(NodeStateName, row.state))  # still suspect
        if change is None:
            return None
        if state == "suspect" and not agent_dead and self.probes is not None:
            # The heartbeat side saw silence: ask the node directly, now.
            await self.probes.probe_now(cluster, row.node_id, now)
        return change

    async def assign_peers(self) -> None:
        """Tell the nodes whose peers changed which peers to probe (one instance per tick)."""
        if self.peers is None or not await self.store.try_lock_sweep(
                "peers", self.settings.peer_assign_period_s * 0.9):
            return
        await self.peers.assign(await self.store.clusters())


def with_fault(sample: Sample, fault: Fault) -> Sample:
    """A sample with one more fault the centre found (its own probe, the peers' verdicts)."""
    return sample.model_copy(update={"faults": [*sample.faults, fault],
                                     "fault_count": sample.fault_count + 1})


class Prober:
    """The centre's side of two-way detection: it probes every node with a signed command.

    A node that still reports but no longer answers commands gets a `probe_failed` fault in
    its samples (so the offline need sees it); a node that stopped reporting is probed at
    once when it turns suspect, and its answer (or silence) is on record for the operator.
    """

    def __init__(self, settings: CollectorSettings, probes: ProbeStore, nodes: NodeStore,
                 signer: CommandSigner, bus: EventBus, clock: Clock = now_utc) -> None:
        self.settings = settings
        self.clock = clock
        self.probes = probes
        self.nodes = nodes
        self.signer = signer
        self.bus = bus

    async def tick(self) -> None:
        """Fail expired probes, then send the probes that are due."""
        if not await self.nodes.try_lock_sweep("probes", self.settings.sweep_interval_s * 0.9):
            return
        now = self.clock()
        for command_id in await self.probes.expired(now):
            ended = await self.probes.end(command_id, answered=False, now=now)
            if ended is not None:
                log.warning("probe of %s unanswered (%d in a row)", *ended)
        for cluster in await self.nodes.clusters():
            for node in await self.probes.claim_due(cluster, now, self.settings.probe_period_s):
                await self.send(cluster, node, now)

    async def send(self, cluster: str, node: str, now: datetime) -> None:
        deadline = now + timedelta(seconds=self.settings.probe_deadline_s)
        # Probes change nothing on the node, so they sit outside its command ordering.
        payload = CommandPayload.for_action(
            ProbeNode(node_id=node), cluster_id=cluster, command_id=uuid4(), issued_at=now,
            expires_at=deadline,
        )
        await self.probes.pending(str(payload.command_id), cluster, node, deadline.timestamp())
        await self.bus.publish(Topic.NODE_COMMANDS, self.signer.sign(payload, SOURCE))

    async def steer_intervals(self, reports: list[NodeReport], now: datetime) -> None:
        """Ask nodes whose report interval is not the scheduled one (day/night) to change it."""
        settings = self.settings
        wanted = policy.desired_interval(now, settings.day_interval_s, settings.night_interval_s,
                                         settings.day_start_hour, settings.day_end_hour)
        if wanted is None:
            return
        for report in reports:
            if abs(report.interval_s - wanted) < 1e-6:
                continue
            # At most one request per node per half minute, whoever of the instances sees it.
            if not await self.probes.request_once(report.cluster_id, report.node_id, 30.0):
                continue
            # Setting an absolute interval is idempotent and disrupts nothing, so like a
            # probe it sits outside the node's command ordering.
            payload = CommandPayload.for_action(
                SetReportInterval(node_id=report.node_id, interval_s=wanted),
                cluster_id=report.cluster_id, command_id=uuid4(), issued_at=now,
                expires_at=now + timedelta(seconds=60),
            )
            await self.bus.publish(Topic.NODE_COMMANDS, self.signer.sign(payload, SOURCE))
            log.info("asked %s to report every %.1fs (was %.1fs)", report.node_id, wanted,
                     report.interval_s)

    async def on_result(self, result: CommandResult) -> None:
        """Any answer to a pending probe (even a rejection) proves the command path works."""
        ended = await self.probes.end(str(result.command_id), answered=True, now=self.clock(),
                                      sent_at=result.occurred_at,
                                      sender=(result.cluster_id, result.node_id))
        if ended is not None and ended[1] < 0:
            # Sealed by a node, but not the probed one: a node must not vouch for another.
            raise PermanentError(WRONG_SENDER, f"answer from {result.cluster_id}/"
                                 f"{result.node_id} to a probe of {ended[0]}")
