"""Router wiring: `faststream run services.router.app:create_app --factory`.

Three consumer groups: submissions (`router`), the agents' answers (`router-results`) and
the agents' reports, consumed in batches, which feed the model registry (`router-registry`);
one loop, the sweep, looks at tasks that are due (an attempt's deadline, a task waiting for
a slot); another reports the waiting tasks as queued demand (services/shared/demand.py).
"""

from __future__ import annotations

from faststream import FastStream

from common.health import checks
from common.messaging import EventBus, make_broker, subscribe
from common.reportauth import authenticator_for, result_seal
from common.signing import local_signer
from common.telemetry import setup_telemetry
from schemas.topics import Topic
from services.router.feed import ReportFeed
from services.router.handlers import Router
from services.router.registry import Registry
from services.router.settings import RouterSettings
from services.router.stats_store import StatsStore
from services.shared.redis_client import Keys, connect_redis
from services.shared.runtime import build_app


def create_app(settings: RouterSettings | None = None) -> FastStream:
    settings = settings or RouterSettings()
    telemetry = setup_telemetry("router")
    broker, dead_letters = make_broker(settings, "router", telemetry)
    redis = connect_redis(settings.redis_url, settings.redis_connect_timeout_s,
                          settings.redis_read_timeout_s)
    keys = Keys(settings.namespace)
    router = Router(
        settings, redis, keys, EventBus(broker, settings.namespace),
        local_signer(settings.signing_key, settings.state_dir, "router"),
        Registry(redis, keys, cache_s=settings.registry_cache_s,
                 forget_after_s=settings.registry_forget_after_s,
                 require_registration=settings.require_registration),
        StatsStore(keys, settings.stats_ttl_s),
    )
    limit = settings.max_message_bytes
    authenticator = authenticator_for(settings)
    feed = ReportFeed(router.registry, dead_letters, limit, authenticator,
                      require_mac=settings.require_report_mac)
    subscribe(broker, settings, Topic.ML_TASKS_SUBMITTED, "router", router.on_submitted)
    subscribe(broker, settings, Topic.NODE_COMMAND_RESULTS, "router-results", router.on_result,
              seal=result_seal(settings, authenticator))
    subscribe(broker, settings, Topic.NODE_REPORTS, "router-registry", feed.on_reports,
              batch_records=settings.batch_max_records)
    return build_app(
        broker, settings,
        loops=[("ml-sweep", settings.sweep_interval_s, router.sweep),
               ("ml-demand", settings.demand_period_s, router.report_demand)],
        closers=[redis.aclose],
        dependencies=[checks.redis(redis)],
    )
