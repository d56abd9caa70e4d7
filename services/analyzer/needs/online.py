"""The online need: an offline node whose fault data has stayed in range for a hold period."""

from __future__ import annotations

from datetime import datetime
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from schemas import ids
from schemas.envelope import short_text
from schemas.events.v1 import Evidence
from services.analyzer.conditions import ConditionState, Evaluation
from services.analyzer.faults import FaultArgs, classify
from services.analyzer.needs.hysteresis import advance, episode_need, held_detail
from services.analyzer.observation import NodeObservation

NAME: Final = "online"
LEVEL: Final = "node"
_HEALTHY: Final = "healthy"


class Args(BaseModel):
    """How long a repaired node must stay fault-free before it returns to service."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hold_s: float = Field(
        default=300.0, ge=0.0, le=7 * 86_400.0,
        # As long as MachineHealthCheck's and Node Healthcheck's usual 300 s: a node that
        # relapses within minutes should not be handed work in between.
        description="Seconds without a counted fault before an offline node comes back.",
    )
    faults: FaultArgs = Field(default_factory=FaultArgs)


def evaluate(
    obs: NodeObservation,
    args: Args,
    now: datetime,
    prior: ConditionState | None,
    source: str,
    dry_run: bool = False,
) -> Evaluation:
    """An online need for an offline node with no counted fault for `hold_s`; a fault resets it."""
    verdict = classify(obs.faults, obs.gpus, args.faults)
    # More faults counted than listed means some were not seen: not proof of health.
    healthy = (
        obs.state == "offline" and not verdict.counted and obs.fault_count <= len(obs.faults)
    )
    state, raise_now = advance(prior, _HEALTHY if healthy else None, obs.observed_at, args.hold_s)
    if state is None or not raise_now:
        return Evaluation(state, [])
    held = held_detail(state, obs.observed_at, args.hold_s)
    recorded = f"; {verdict.detail}" if verdict.detail else ""
    need = episode_need(
        ids.NEEDS_ONLINE, cluster=obs.cluster_id, pool=obs.pool, target=obs.node_id, kind="online",
        level=LEVEL, state=state, now=now, source=source, dry_run=dry_run,
        cause=obs.source_event_id,
        evidence=[
            Evidence(
                metric="node_fault_count", value=0.0, range_low=0.0, range_high=0.0,
                observed_at=obs.observed_at, source_event_id=obs.source_event_id,
                detail=short_text(f"offline and fault-free: {held}{recorded}"),
            )
        ],
    )
    return Evaluation(state, [need])
