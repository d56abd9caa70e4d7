"""Scheduler wiring: `faststream run services.scheduler.app:create_app --factory`."""

from __future__ import annotations

from faststream import FastStream

from common.health import checks
from common.messaging import EventBus, make_broker, subscribe
from common.observability import sample_period_s
from common.telemetry import setup_telemetry
from schemas.topics import Topic
from services.scheduler.breaker_store import BreakerStore
from services.scheduler.gauges import LimitGauges
from services.scheduler.handlers import Scheduler
from services.scheduler.queue import TaskQueue
from services.scheduler.rate_limit import RateLimiter
from services.scheduler.relations_store import RelationStore
from services.scheduler.safety_store import SafetyStore
from services.scheduler.settings import SchedulerSettings
from services.shared.maintenance import MaintenanceStore
from services.shared.redis_client import Keys, connect_redis
from services.shared.runtime import build_app


def create_app(settings: SchedulerSettings | None = None) -> FastStream:
    settings = settings or SchedulerSettings()
    telemetry = setup_telemetry("scheduler")
    broker, _ = make_broker(settings, "scheduler", telemetry)
    redis = connect_redis(settings.redis_url, settings.redis_connect_timeout_s,
                          settings.redis_read_timeout_s)
    keys = Keys(settings.namespace)
    breakers = BreakerStore(redis, keys, settings.breaker_config)
    safety = SafetyStore(redis, keys, settings.pool_health_ttl_s)
    rate_limiter = RateLimiter(redis, keys, settings.rate_per_s, settings.rate_burst)
    gauges = LimitGauges(settings, redis, keys, breakers, safety, rate_limiter)
    scheduler = Scheduler(settings, TaskQueue(redis, keys), EventBus(broker, settings.namespace),
                          breakers, safety, rate_limiter,
                          maintenance=MaintenanceStore(redis, keys),
                          relations=RelationStore(redis, keys))
    subscribe(broker, settings, Topic.OPS_TASKS, "scheduler", scheduler.on_task)
    subscribe(broker, settings, Topic.OPS_TASK_EVENTS, "scheduler-outcomes",
              scheduler.on_task_event)
    subscribe(broker, settings, Topic.OPS_POOL_HEALTH, "scheduler-pool-health",
              scheduler.on_pool_health)
    return build_app(
        broker, settings,
        loops=[("dispatcher", settings.dispatch_interval_s, scheduler.dispatch),
               ("limit-gauges", sample_period_s(), gauges.sample)],
        closers=[redis.aclose],
        dependencies=[checks.redis(redis)],
    )
