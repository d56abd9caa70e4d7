"""Analyzer handlers: observations in, registered needs evaluated, new needs published.

Node-level needs run on every sample (and the stateless ones on node-state changes too);
cluster-level needs run every pool period on the pools' aggregates, which also publishes
each pool's health (nodes per state, unhealthy fraction, utilisation) for the scheduler.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from datetime import datetime
from uuid import UUID, uuid5

from faststream.kafka import KafkaMessage
from opentelemetry import trace

from common.clock import Clock
from common.crashpoints import crash_point
from common.messaging import EventBus
from common.tracing import (
    current_trace,
    item_span,
    item_traces,
    need_attributes,
    span_trace,
)
from schemas import ids
from schemas.events.v1 import (
    NodeState,
    OpsNeed,
    PoolHealth,
    SampleBatch,
    now_utc,
    state_from_mode,
)
from schemas.topics import Topic
from services.analyzer.faults import classify
from services.analyzer.host import host_faults
from services.analyzer.metrics import record_needs, record_pools
from services.analyzer.needs import NeedModule
from services.analyzer.observation import NodeObservation, PoolObservation
from services.analyzer.settings import AnalyzerSettings
from services.analyzer.store import AnalyzerStore, FatalEpisode, PoolStore
from services.shared.redis_client import Keys

log = logging.getLogger("clusterwarden.analyzer")
SOURCE = "analyzer"
_tracer = trace.get_tracer("clusterwarden.analyzer")


class Analyzer:
    """Evaluates every enabled need against node and pool observations."""

    def __init__(self, settings: AnalyzerSettings, needs: list[NeedModule], store: AnalyzerStore,
                 pools: PoolStore, bus: EventBus, keys: Keys, clock: Clock = now_utc) -> None:
        self.settings = settings
        self.clock = clock
        self.needs = needs
        self.store = store
        self.pools = pools
        self.bus = bus
        self.keys = keys

    async def on_samples(self, batch: SampleBatch, msg: KafkaMessage) -> None:
        """A batch of samples, each analysed in a span of its own report's trace (the
        collector lists each sample's context in the message's headers), so a need a sample
        raises goes on in the trace of the report that showed the fault."""
        spans = [item_span(_tracer, "analyzer.sample", packed, kind=trace.SpanKind.CONSUMER,
                           attributes={"node.id": s.node_id, "cluster.id": s.cluster_id,
                                       "report.seq": s.seq})
                 for s, packed in zip(batch.samples,
                                      item_traces(msg.headers, len(batch.samples)),
                                      strict=True)]
        try:
            await self.analyze_samples(batch, {s.report_event_id: span for s, span
                                               in zip(batch.samples, spans, strict=True)})
        finally:
            for span in spans:
                span.end()

    async def analyze_samples(self, batch: SampleBatch,
                              origins: Mapping[UUID, trace.Span] | None = None) -> None:
        """A batch of samples: fault runs in one Redis call, then every node need. `origins`:
        the span of each sample by its report's id, in which the needs it raises go out."""
        # Only faults that call for action make a run: an application XID alone does not.
        fault_args = self.settings.offline.faults
        faults = [[*s.faults, *host_faults(s.disk_used_pct, s.memory_pct,
                                           self.settings.offline.host)] for s in batch.samples]
        faulty = [bool(classify(f, (), fault_args).counted) or s.fault_count > len(s.faults)
                  for s, f in zip(batch.samples, faults, strict=True)]
        runs = await self.store.fault_runs(batch.samples, faulty)
        recent = await self.recent_fatal(batch, runs)
        pool_load = {
            (p.cluster_id, p.pool): p.effective_utilization_pct
            for p in await self.pools.observe_pools(self.clock())
        } if any(m.level == "node" and m.stateful for m in self.needs) else {}
        spreads = await self.pools.spreads(sorted({
            (s.cluster_id, s.pool) for s in batch.samples
        })) if any(m.name == "load_balance" for m in self.needs) else {}
        await self.evaluate_nodes([
            NodeObservation(
                cluster_id=sample.cluster_id, node_id=sample.node_id, pool=sample.pool,
                state=state_from_mode(sample.mode),
                fault_count=sample.fault_count + len(found) - len(sample.faults),
                faults=tuple(found), disk_used_pct=sample.disk_used_pct,
                storage_weight=self.settings.storage_weight,
                consecutive_faulty=run, gpu_utilization_pct=sample.gpu_utilization_pct,
                observed_at=sample.reported_at, source_event_id=sample.report_event_id,
                pool_effective_utilization_pct=pool_load.get((sample.cluster_id, sample.pool)),
                recent_fatal=fatal, movable_jobs=sample.movable_jobs,
                pinned_jobs=sample.pinned_jobs,
                spread=spreads.get((sample.cluster_id, sample.pool)),
            )
            for sample, run, fatal, found in zip(batch.samples, runs, recent, faults,
                                                 strict=True)
        ], from_samples=True, origins=origins)

    async def recent_fatal(self, batch: SampleBatch, runs: list[int]) -> list[dict[int, int]]:
        """Per sample, each faulty GPU's earlier fatal episodes within the repeat window, for
        the escalation of a GPU that keeps failing (e.g. 5 in 24 h: replace it)."""
        args = self.settings.offline.faults
        items: list[FatalEpisode] = []
        owners: list[tuple[int, int]] = []
        for i, (sample, run) in enumerate(zip(batch.samples, runs, strict=True)):
            fatal = classify(sample.faults, (), args).fatal_by_gpu
            for gpu in fatal:
                # The episode is named by the sample that started the run of faulty reports.
                episode = f"{sample.node_id}:{gpu}:{sample.report_event_id if run == 1 else ''}"
                items.append(FatalEpisode(sample.cluster_id, sample.node_id, gpu, episode,
                                          starts_now=run == 1))
                owners.append((i, gpu))
        counts = await self.store.fatal_episodes(items, self.clock().timestamp(),
                                                 args.repeat_window_s)
        recent: list[dict[int, int]] = [{} for _ in batch.samples]
        for (i, gpu), count in zip(owners, counts, strict=True):
            recent[i][gpu] = max(0, count - 1)  # earlier episodes: not the current one
        return recent

    async def on_node_state(self, event: NodeState) -> None:
        """A state change (e.g. `down`): only the stateless needs look at it, as it carries
        no utilisation or fault data."""
        await self.evaluate_nodes([
            NodeObservation(
                cluster_id=event.cluster_id, node_id=event.node_id, pool=event.pool,
                state=event.state, fault_count=0, observed_at=event.occurred_at,
                source_event_id=event.event_id, reason=event.reason,
                agent_dead=event.agent_dead,
            )
        ], from_samples=False)

    async def evaluate_nodes(self, observations: list[NodeObservation], from_samples: bool,
                             origins: Mapping[UUID, trace.Span] | None = None) -> None:
        now = self.clock()
        raised: list[OpsNeed] = []
        for module in self.needs:
            if module.level != "node":
                continue
            if module.detect is not None:
                raised += [
                    need for obs in observations
                    for need in module.detect(
                        obs, self.settings.args_for(module.name, obs.cluster_id, obs.pool),
                        now, SOURCE)
                ]
            elif from_samples:
                raised += await self._evaluate(
                    module, observations, [o.node_id for o in observations], now)
        await self.publish(raised, origins)

    async def analyze_pools(self) -> None:
        """One pool period: publish each pool's health, then run the cluster-level needs."""
        if not await self.pools.try_lock_tick("pools", self.settings.pool_period_s * 0.9):
            return  # another analyzer instance analyses this period
        now = self.clock()
        observations = await self.pools.with_demand(await self.pools.observe_pools(now), now)
        for pool in observations:
            await self.pools.record_utilization(pool)
        await self.bus.publish_many(Topic.OPS_POOL_HEALTH,
                                    [pool_health(pool, now) for pool in observations])
        record_pools(observations, self.settings)
        raised: list[OpsNeed] = []
        for module in self.needs:
            if module.level == "cluster":
                raised += await self._evaluate(
                    module, observations, [o.pool for o in observations], now)
        await self.publish(raised)

    async def _evaluate(self, module: NeedModule,
                        observations: Sequence[NodeObservation | PoolObservation],
                        targets: list[str], now: datetime) -> list[OpsNeed]:
        """A stateful need over many observations: priors in, next states out, in bulk."""
        assert module.evaluate is not None
        keys = [self.keys.condition(module.name, obs.cluster_id, target)
                for obs, target in zip(observations, targets, strict=True)]
        priors = await self.pools.load_conditions(keys)
        changes, needs = [], []
        for obs, key, prior in zip(observations, keys, priors, strict=True):
            args = self.settings.args_for(module.name, obs.cluster_id, obs.pool)
            result = module.evaluate(obs, args, now, prior, SOURCE, self.settings.dry_run)
            if result.state != prior:
                changes.append((key, result.state))
            needs += result.needs
        await self.pools.save_conditions(changes)
        return needs

    async def publish(self, needs: list[OpsNeed],
                      origins: Mapping[UUID, trace.Span] | None = None) -> None:
        """Publish needs that are not already open (an identical open need is not raised).

        Marking a need open and keeping it to publish are one Redis call (the outbox): a
        crash before the broker has it leaves it to the relay, never lost behind its mark.
        Each need goes out (and waits in the outbox) in the trace of the sample its evidence
        names (`origins`, by report id), else in the current one."""
        needs = [need.model_copy(update={
            # The ranges it was raised under travel with it, to the executor's guards.
            "ranges": self.settings.ranges_for(need.cluster_id, need.pool),
            "dry_run": need.dry_run or self.settings.dry_run,
        }) for need in needs]
        parents = {need.event_id: _origin(need, origins or {}) for need in needs}
        fresh = await self.store.open_needs(
            needs, self.settings.open_need_ttl_s, self.clock(),
            traces=[current_trace() if (parent := parents[need.event_id]) is None
                    else span_trace(parent) for need in needs])
        for need in fresh:
            log.info("need %s for %s%s: %s", need.kind, need.target,
                     " (dry run)" if need.dry_run else "",
                     need.evidence[0].detail or need.evidence[0].metric)
        if fresh:
            crash_point("analyzer.after_open_need")
        for need in fresh:
            # One by one, each in its sample's trace (needs are few: one per fault episode).
            parent = parents[need.event_id]
            with (nullcontext() if parent is None
                  else trace.use_span(parent, end_on_exit=False)), \
                    _tracer.start_as_current_span("analyzer.need",
                                                  attributes=need_attributes(need)):
                await self.bus.publish_many(Topic.OPS_NEEDS, [need])
        await self.store.outbox.delivered(need.event_id for need in fresh)
        record_needs(fresh, self.clock())

    async def relay_outbox(self) -> None:
        """Publish the needs a dead analyzer marked open and left unpublished."""
        await self.store.outbox.relay(self.bus, self.clock(), self.settings.outbox_grace_s)


def _origin(need: OpsNeed, origins: Mapping[UUID, trace.Span]) -> trace.Span | None:
    """The span of the sample a need's evidence names, if it is among `origins`."""
    return next((origins[e.source_event_id] for e in need.evidence
                 if e.source_event_id is not None and e.source_event_id in origins), None)


def pool_health(pool: PoolObservation, now: datetime) -> PoolHealth:
    """The published health of a pool at one analysis period."""
    return PoolHealth(
        event_id=uuid5(ids.POOL_HEALTH,
                       f"health:{pool.cluster_id}:{pool.pool}:{now.timestamp():.3f}"),
        source=SOURCE, occurred_at=now, cluster_id=pool.cluster_id, subject=pool.pool,
        pool=pool.pool, nodes_total=pool.nodes_total,
        nodes_by_state=dict(pool.nodes_by_state),
        unhealthy_fraction=round(pool.unhealthy_fraction, 6),
        gpu_utilization_pct=pool.gpu_utilization_pct,
        demand_pct=pool.demand_pct,
        effective_utilization_pct=round(pool.effective_utilization_pct, 3),
    )
