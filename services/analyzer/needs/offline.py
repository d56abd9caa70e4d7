"""The offline need: fault data outside its range (default: any fault at all)."""

from __future__ import annotations

from datetime import datetime
from uuid import NAMESPACE_URL, uuid5

from pydantic import BaseModel, ConfigDict, Field

from schemas.events.v1 import Evidence, OpsNeed
from services.analyzer.observation import NodeObservation

NAME = "offline"
_IDS = uuid5(NAMESPACE_URL, "clusterwarden/needs/offline")


class Args(BaseModel):
    """The fault range and how long a fault must hold before it is a need."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fault_max: int = Field(default=0, ge=0, description="More faults than this leave the range.")
    min_consecutive_reports: int = Field(
        default=2, ge=1, le=100,
        description="A single bad report is never enough to take a node offline.",
    )


def detect(obs: NodeObservation, args: Args, now: datetime, source: str) -> list[OpsNeed]:
    """An offline need for a node that is down, or whose faults held above the range."""
    if obs.state == "down":
        evidence = Evidence(
            metric="heartbeat_missed", value=1.0, range_low=0.0, range_high=0.0,
            observed_at=obs.observed_at, source_event_id=obs.source_event_id,
            detail=obs.reason[:256],
        )
    elif (
        obs.state in ("up", "suspect")
        and obs.fault_count > args.fault_max
        and obs.consecutive_faulty >= args.min_consecutive_reports
    ):
        kinds = ",".join(sorted({f"{f.kind}:{f.code}" if f.code is not None else f.kind
                                  for f in obs.faults}))
        evidence = Evidence(
            metric="node_fault_count", value=float(obs.fault_count), range_low=0.0,
            range_high=float(args.fault_max), observed_at=obs.observed_at,
            source_event_id=obs.source_event_id,
            detail=f"{obs.consecutive_faulty} consecutive faulty reports; {kinds}"[:256],
        )
    else:
        return []
    return [
        OpsNeed(
            event_id=uuid5(_IDS, f"{obs.cluster_id}:{obs.node_id}:{obs.source_event_id}"),
            source=source,
            occurred_at=now,
            cluster_id=obs.cluster_id,
            subject=obs.node_id,
            correlation_id=str(obs.source_event_id),
            kind="offline",
            pool=obs.pool,
            target=obs.node_id,
            evidence=[evidence],
        )
    ]
