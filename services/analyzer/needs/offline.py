"""The offline need: fault data outside its range (default: any fault that calls for action)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from schemas import ids
from schemas.envelope import short_text
from schemas.events.v1 import ActionClass, Evidence, NeedLevel, OpsNeed
from services.analyzer.faults import (
    NODE_FAULT_ACTION,
    FaultArgs,
    FaultVerdict,
    classify,
    describe,
)
from services.analyzer.host import HostArgs, host_only
from services.analyzer.needs.node_need import node_need
from services.analyzer.observation import NodeObservation

NAME: Final = "offline"
LEVEL: Final = "node"
_MAX_EVIDENCE = 32


class Args(BaseModel):
    """The fault range, how long a fault must persist before it is a need, and classification."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fault_max: int = Field(
        default=0, ge=0, description="More counted faults than this leave the range."
    )
    min_consecutive_reports: int = Field(
        default=2, ge=1, le=100,
        description="A single bad report is never enough to take a node offline.",
    )
    faults: FaultArgs = Field(default_factory=FaultArgs)
    host: HostArgs = Field(default_factory=HostArgs)


def _gpu_evidence(obs: NodeObservation, verdict: FaultVerdict) -> list[Evidence]:
    """One line of evidence per faulty GPU: its faults and the class each calls for."""
    by_gpu: dict[int, list[str]] = {}
    for c in verdict.counted:
        if c.fault.gpu_index is not None:
            by_gpu.setdefault(c.fault.gpu_index, []).append(
                f"{describe(c.fault)}: {c.action_class}")
    return [
        Evidence(
            metric=f"gpu{index}_fault_count", value=float(len(lines)), range_low=0.0,
            range_high=0.0, observed_at=obs.observed_at, source_event_id=obs.source_event_id,
            detail=short_text("; ".join(lines)),
        )
        for index, lines in sorted(by_gpu.items())
    ][: _MAX_EVIDENCE - 1]


def detect(
    obs: NodeObservation,
    args: Args,
    now: datetime,
    source: str,
    *,
    dry_run: bool = False,
    recent_fatal: Mapping[int, int] | None = None,
) -> list[OpsNeed]:
    """An offline need for a node that is down, or whose counted faults held above the range.

    `recent_fatal` counts each GPU's earlier fatal faults in the repeat window (from a fault
    history the caller keeps); enough of them escalate that GPU's faults to `replace`.
    """
    action: ActionClass
    level: NeedLevel
    if obs.state == "down":
        evidence = [Evidence(
            metric="heartbeat_missed", value=1.0, range_low=0.0, range_high=0.0,
            observed_at=obs.observed_at, source_event_id=obs.source_event_id,
            detail=short_text(obs.reason),
        )]
        action, level = NODE_FAULT_ACTION, "node"
    elif obs.state in ("up", "suspect"):
        verdict = classify(obs.faults, obs.gpus, args.faults,
                           recent_fatal if recent_fatal is not None else obs.recent_fatal)
        # Faults only recorded (application XIDs, unknown XIDs) never take a node offline;
        # host pressure alone must last longer than a GPU fault.
        needed = (max(args.min_consecutive_reports, args.host.min_consecutive_reports)
                  if host_only(c.fault for c in verdict.counted) else
                  args.min_consecutive_reports)
        if len(verdict.counted) <= args.fault_max or obs.consecutive_faulty < needed:
            return []
        evidence = [
            Evidence(
                metric="node_fault_count", value=float(len(verdict.counted)), range_low=0.0,
                range_high=float(args.fault_max), observed_at=obs.observed_at,
                source_event_id=obs.source_event_id,
                detail=short_text(f"{obs.consecutive_faulty} consecutive faulty reports; "
                                  f"{verdict.detail}"),
            ),
            *_gpu_evidence(obs, verdict),
        ]
        action, level = verdict.action_class, "gpu" if verdict.gpu_only else "node"
    else:
        # Draining or offline already: the node is on its way out, or out.
        return []
    return [node_need(ids.NEEDS_OFFLINE, obs, "offline", evidence, now, source, level=level,
                      action_class=action, dry_run=dry_run)]
