"""The scheduler's limits as gauges (services/scheduler/gauges.py), read from the real
redis-server: breakers counted by kind, scope and state (a closed one back at 0 open), each
pool's budget, and each rate-limited kind's tokens as `take` would find them."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from redis.asyncio import Redis

from common.metrics import (
    BREAKERS,
    BUDGET_CAPACITY,
    BUDGET_IN_FLIGHT,
    RATE_LIMIT_TOKENS,
    GaugeSpec,
    Instruments,
)
from services.scheduler.gauges import LimitGauges
from services.scheduler.handlers import Scheduler
from services.shared.audit import AuditLog
from services.shared.redis_client import Keys
from tests.service.scheduler.helpers import Clock, task
from tests.service.scheduler.test_limits import dispatched, fail, queue, scheduler


def gauges_of(s: Scheduler, redis: Redis, keys: Keys,
              clock: Clock) -> tuple[LimitGauges, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    recorded = Instruments(MeterProvider(metric_readers=[reader]).get_meter("test"))
    return LimitGauges(s.settings, redis, keys, s.breakers, s.safety, s.rate_limiter,
                       clock=clock, recorded=recorded), reader


def values(reader: InMemoryMetricReader, spec: GaugeSpec) -> dict[tuple[Any, ...], float]:
    """The gauge's last values by their attribute values (in key order)."""
    data = reader.get_metrics_data()
    assert data is not None
    return {tuple(v for _, v in sorted((p.attributes or {}).items())): p.value
            for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            if m.name == spec.name for p in m.data.data_points
            if isinstance(p, NumberDataPoint)}


async def test_breakers_budgets_and_tokens_are_read_as_the_scheduler_leaves_them(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = scheduler(redis, keys, clock, breaker_scope="node", rate_burst=2)
    await fail(s, task("node-1"), task("node-1"), task("node-1"))  # offline@node-1 opens
    await queue(s, task("node-2"))  # a pool of 100 up nodes: a budget of 10
    await s.dispatch()
    assert dispatched(s) == ["node-2"]
    # What the collector keeps: the clusters and their pools.
    await redis.sadd(keys.clusters(), "local")
    await redis.sadd(keys.pools("local"), "default")
    gauges, reader = gauges_of(s, redis, keys, clock)

    await gauges.sample()
    breakers = values(reader, BREAKERS)
    # (cluster, kind, scope, state): node-scoped breakers counted, never named.
    assert breakers[("local", "offline", "node", "OPEN")] == 1
    # Every state of a group seen, at 0 too (a breaker that never failed is not stored).
    assert breakers[("local", "offline", "node", "CLOSED")] == 0
    assert breakers[("local", "offline", "node", "HALF_OPEN")] == 0
    assert values(reader, BUDGET_CAPACITY) == {("local", "default"): 10}
    assert values(reader, BUDGET_IN_FLIGHT) == {("local", "default"): 1}
    tokens = values(reader, RATE_LIMIT_TOKENS)
    assert tokens[("local", "offline")] == 1  # a burst of 2, one taken
    assert tokens[("local", "scale_in")] == 2  # never used: a full bucket

    clock.advance(5.0)  # 0.1 a second
    await s.breakers.reset("local", "offline@node-1", "ada", "fixed", AuditLog(redis, keys))
    await gauges.sample()
    assert values(reader, BREAKERS)[("local", "offline", "node", "OPEN")] == 0
    assert values(reader, RATE_LIMIT_TOKENS)[("local", "offline")] == 1.5
