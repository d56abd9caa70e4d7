"""Analyzer handlers: observation in, registered needs evaluated, new needs published."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from schemas.events.v1 import NodeMode, NodeState, NodeStateName, OpsNeed, Sample, now_utc
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

    async def on_sample(self, sample: Sample) -> None:
        faulty = sample.fault_count > 0
        run = await self.store.count_faulty(sample.cluster_id, sample.node_id,
                                            str(sample.event_id), faulty)
        state = _STATE_OF_MODE[sample.mode]
        await self.evaluate(
            NodeObservation(
                cluster_id=sample.cluster_id, node_id=sample.node_id, pool=sample.pool,
                state=state,
                fault_count=sample.fault_count, faults=tuple(sample.faults),
                consecutive_faulty=run, observed_at=sample.reported_at,
                source_event_id=sample.report_event_id,
            )
        )

    async def on_node_state(self, event: NodeState) -> None:
        await self.evaluate(
            NodeObservation(
                cluster_id=event.cluster_id, node_id=event.node_id, pool=event.pool,
                state=event.state, fault_count=0, observed_at=event.occurred_at,
                source_event_id=event.event_id, reason=event.reason,
            )
        )

    async def evaluate(self, obs: NodeObservation) -> None:
        now = now_utc()
        raised: list[OpsNeed] = []
        for module in self.needs:
            args = getattr(self.settings, module.name)
            for need in module.detect(obs, args, now, SOURCE):
                if await self.store.open_need(need.cluster_id, need.kind, need.target,
                                              self.settings.open_need_ttl_s):
                    raised.append(need)
                    log.info("need %s for %s: %s", need.kind, need.target,
                             need.evidence[0].detail or need.evidence[0].metric)
        await self.bus.publish_many(Topic.OPS_NEEDS, raised)
