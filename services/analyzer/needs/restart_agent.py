"""The restart-agent need: a node that stopped reporting while its peers still reach it.

The collector decides (peer quorum, freshness: services/collector/peer_policy.py) and says so
with a `suspect` node state marked `agent_dead`; the node is alive, so taking it offline
would take working GPUs out of service for a dead process. Restarting the agent is the cure.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from pydantic import BaseModel, ConfigDict

from schemas import ids
from schemas.envelope import short_text
from schemas.events.v1 import Evidence, OpsNeed
from services.analyzer.needs.node_need import node_need
from services.analyzer.observation import NodeObservation

NAME: Final = "restart_agent"
LEVEL: Final = "node"


class Args(BaseModel):
    """No arguments: the collector's peer quorum already decided."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def detect(obs: NodeObservation, args: Args, now: datetime, source: str, *,
           dry_run: bool = False) -> list[OpsNeed]:
    """A restart-agent need for a suspect node whose agent the collector found dead."""
    if obs.state != "suspect" or not obs.agent_dead:
        return []
    evidence = [Evidence(
        metric="agent_dead", value=1.0, range_low=0.0, range_high=0.0,
        observed_at=obs.observed_at, source_event_id=obs.source_event_id,
        detail=short_text(obs.reason),
    )]
    return [node_need(ids.NEEDS_RESTART_AGENT, obs, "restart_agent", evidence, now, source,
                      dry_run=dry_run)]
