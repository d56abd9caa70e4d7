"""A need about one node, raised from one observation of it (the stateless node needs)."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID, uuid5

from schemas.events.v1 import ActionClass, Evidence, NeedKind, NeedLevel, OpsNeed
from services.analyzer.observation import NodeObservation


def node_need(namespace: UUID, obs: NodeObservation, kind: NeedKind, evidence: list[Evidence],
              now: datetime, source: str, *, level: NeedLevel = "node",
              action_class: ActionClass | None = None, dry_run: bool = False) -> OpsNeed:
    """The need, identified by the observation it came from (a redelivery: the same id)."""
    return OpsNeed(
        event_id=uuid5(namespace, f"{obs.cluster_id}:{obs.node_id}:{obs.source_event_id}"),
        source=source,
        occurred_at=now,
        cluster_id=obs.cluster_id,
        subject=obs.node_id,
        correlation_id=str(obs.source_event_id),
        kind=kind,
        level=level,
        pool=obs.pool,
        target=obs.node_id,
        evidence=evidence,
        action_class=action_class,
        dry_run=dry_run,
    )
