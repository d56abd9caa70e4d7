"""Analyzer handlers: observation in, registered needs evaluated, new needs published."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from schemas.events.v1 import NodeMode, NodeState, NodeStateName, OpsNeed, SampleBatch, now_utc
from schemas.topics import Topic
from services.analyzer.needs import NeedModule
from services.analyzer.observation import NodeObservation
from services.analyzer.settings import AnalyzerSettings
from services.analyzer.store import AnalyzerStore
from services.shared.messaging import EventBus

log = logging.getLogger("clusterwarden.analyzer")
SOURCE = "analyzer"

# The state a report implies: a reporting node is up unless it drained itself.
_STATE_OF_MODE: Mapping[NodeMode, NodeStateName] = {
    "active": "up", "draining": "draining", "offline": "offline",
}


class Analyzer:
    """Evaluates every enabled need against each observation of a node."""

    def __init__(self, settings: AnalyzerSettings, needs: list[NeedModule], store: AnalyzerStore,
                 bus: EventBus) -> None:
        self.settings = settings
        self.needs = needs
        self.store = store
        self.bus = bus

    async def on_samples(self, batch: SampleBatch) -> None:
        """A batch of samples: one Redis call for the fault runs, then every need evaluated."""
        runs = await self.store.fault_runs(batch.samples)
        await self.evaluate([
            NodeObservation(
                cluster_id=sample.cluster_id, node_id=sample.node_id, pool=sample.pool,
                state=_STATE_OF_MODE[sample.mode],
                fault_count=sample.fault_count, faults=tuple(sample.faults),
                consecutive_faulty=run, observed_at=sample.reported_at,
                source_event_id=sample.report_event_id,
            )
            for sample, run in zip(batch.samples, runs, strict=True)
        ])

    async def on_node_state(self, event: NodeState) -> None:
        await self.evaluate([
            NodeObservation(
                cluster_id=event.cluster_id, node_id=event.node_id, pool=event.pool,
                state=event.state, fault_count=0, observed_at=event.occurred_at,
                source_event_id=event.event_id, reason=event.reason,
            )
        ])

    async def evaluate(self, observations: list[NodeObservation]) -> None:
        """Run every enabled need over the observations; publish the needs not already open."""
        now = now_utc()
        raised: list[OpsNeed] = []
        detected = [
            need
            for obs in observations
            for module in self.needs
            for need in module.detect(obs, getattr(self.settings, module.name), now, SOURCE)
        ]
        for need in detected:
            if await self.store.open_need(need.cluster_id, need.kind, need.target,
                                          self.settings.open_need_ttl_s):
                raised.append(need)
                log.info("need %s for %s: %s", need.kind, need.target,
                         need.evidence[0].detail or need.evidence[0].metric)
        await self.bus.publish_many(Topic.OPS_NEEDS, raised)
