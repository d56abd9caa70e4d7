"""What the analyzer measures (common/metrics.py): the needs it raises and how long after
their observation, and each pool's utilisation, range and nodes by state at every pool
period (the utilisation dashboard draws the range as a band around the utilisation)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import get_args

from common.metrics import (
    FAULT_TO_NEED,
    NEEDS,
    POOL_NODES,
    POOL_RANGE,
    POOL_UTILIZATION,
    Instruments,
    instruments,
)
from schemas.events.v1 import NodeStateName, OpsNeed
from services.analyzer.observation import PoolObservation
from services.analyzer.settings import AnalyzerSettings

NODE_STATES: tuple[NodeStateName, ...] = get_args(NodeStateName)


def record_needs(needs: Iterable[OpsNeed], published_at: datetime,
                 recorded: Instruments | None = None) -> None:
    """Needs just published: counted by kind, and timed from the observation they were
    raised on (the newest of their evidence: the report that tipped it)."""
    recorded = recorded or instruments()
    count, latency = recorded.counter(NEEDS), recorded.histogram(FAULT_TO_NEED)
    for need in needs:
        count.add(1, {"kind": need.kind, "level": need.level})
        observed = max(e.observed_at for e in need.evidence)
        latency.record(max(0.0, (published_at - observed).total_seconds()),
                       {"kind": need.kind})


def record_pools(pools: Sequence[PoolObservation], settings: AnalyzerSettings,
                 recorded: Instruments | None = None) -> None:
    """Each pool's utilisation, its range's thresholds and its nodes by state (every state,
    0 included, so a state emptied reads 0 rather than its last count)."""
    recorded = recorded or instruments()
    utilization = recorded.gauge(POOL_UTILIZATION)
    bounds, nodes = recorded.gauge(POOL_RANGE), recorded.gauge(POOL_NODES)
    for pool in pools:
        where = {"cluster": pool.cluster_id, "pool": pool.pool}
        utilization.set(pool.gpu_utilization_pct, where | {"measure": "gpu"})
        utilization.set(pool.effective_utilization_pct, where | {"measure": "effective"})
        utilization.set(pool.demand_pct, where | {"measure": "demand"})
        band = settings.ranges_for(pool.cluster_id, pool.pool).pool
        for bound in ("low_enter", "low_exit", "high_exit", "high_enter"):
            bounds.set(getattr(band, bound), where | {"bound": bound})
        for state in NODE_STATES:
            nodes.set(pool.nodes_by_state.get(state, 0), where | {"state": state})
