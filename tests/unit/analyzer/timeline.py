"""Builders for analyzer observations, and a runner that feeds a need one observation at a time."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import NAMESPACE_URL, UUID, uuid5

from schemas.events.v1 import Fault, GpuMetrics, NodeStateName, OpsNeed
from services.analyzer.conditions import ConditionState, Evaluation
from services.analyzer.observation import NodeObservation, PoolObservation

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
Obs = TypeVar("Obs", NodeObservation, PoolObservation)


def at(seconds: float) -> datetime:
    """The moment `seconds` after T0."""
    return T0 + timedelta(seconds=seconds)


def report_id(seconds: float) -> UUID:
    """A stable event id per moment, so reruns of a timeline build identical observations."""
    return uuid5(NAMESPACE_URL, f"test-report/{seconds}")


def node(
    seconds: float = 0.0,
    *,
    state: NodeStateName = "up",
    util: float = 50.0,
    pool_util: float | None = 50.0,
    faults: Sequence[Fault] = (),
    fault_count: int | None = None,
    gpus: Sequence[GpuMetrics] = (),
    run: int = 0,
    **extra: Any,
) -> NodeObservation:
    """A node observation at T0 + `seconds` (`extra`: any other field of the observation)."""
    return NodeObservation(
        cluster_id="local", node_id="node-007", pool="train", state=state,
        fault_count=len(faults) if fault_count is None else fault_count, faults=tuple(faults),
        consecutive_faulty=run, gpu_utilization_pct=util, gpus=tuple(gpus),
        observed_at=at(seconds), source_event_id=report_id(seconds),
        pool_effective_utilization_pct=pool_util, **extra,
    )


def pool(
    seconds: float = 0.0,
    *,
    util: float = 50.0,
    demand: float = 0.0,
    states: dict[NodeStateName, int] | None = None,
) -> PoolObservation:
    """A pool observation at T0 + `seconds` (four nodes up unless `states` says otherwise)."""
    return PoolObservation(
        cluster_id="local", pool="train", nodes_by_state=states or {"up": 4},
        gpu_utilization_pct=util, demand_pct=demand, observed_at=at(seconds),
    )


def gpu(index: int = 0, **metrics: object) -> GpuMetrics:
    """A healthy GPU, with `metrics` overriding any field."""
    fields: dict[str, object] = {
        "index": index, "uuid": f"GPU-{index}", "name": "A100", "utilization_pct": 50.0,
        "memory_used_mib": 1_024, "memory_total_mib": 81_920, "temperature_c": 55.0,
        "power_w": 250.0,
    }
    return GpuMetrics.model_validate(fields | metrics)


Evaluator = Callable[[Obs, ConditionState | None], Evaluation]


def run(evaluate: Evaluator[Obs], observations: Sequence[Obs]) -> list[list[OpsNeed]]:
    """Feed the observations in order, threading the condition state; the needs of each step."""
    state: ConditionState | None = None
    raised: list[list[OpsNeed]] = []
    for obs in observations:
        state, needs = evaluate(obs, state)
        raised.append(needs)
    return raised


def raised_at(steps: list[list[OpsNeed]], times: Sequence[float]) -> list[tuple[float, str]]:
    """(time, kind) of every need raised over a run."""
    return [(t, need.kind) for t, needs in zip(times, steps, strict=True) for need in needs]
