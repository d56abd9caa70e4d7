"""Executor wiring: `faststream run services.executor.app:create_app --factory`."""

from __future__ import annotations

from faststream import FastStream

from common.health import checks
from common.messaging import EventBus, make_broker, subscribe
from common.reportauth import result_seal
from common.signing import local_signer
from common.telemetry import setup_telemetry
from schemas.topics import Topic
from services.executor.broker_health import MetadataProbe
from services.executor.handlers import Executor
from services.executor.journal import Journal
from services.executor.settings import ExecutorSettings
from services.shared.redis_client import Keys, connect_redis
from services.shared.runtime import build_app


def create_app(settings: ExecutorSettings | None = None) -> FastStream:
    # The concrete centre (cluster view, capacity provider) is imported here only: the
    # handlers know it through the CentreActions port.
    from services.executor.backend_steps import ClusterBackends
    from services.executor.centre import build_centre

    settings = settings or ExecutorSettings()
    telemetry = setup_telemetry("executor")
    broker, _ = make_broker(settings, "executor", telemetry)
    redis = connect_redis(settings.redis_url, settings.redis_connect_timeout_s,
                          settings.redis_read_timeout_s)
    keys = Keys(settings.namespace)
    signer = local_signer(settings.signing_key, settings.state_dir, "executor")
    # Each cluster's registered backend (services/shared/registry.py): Kubernetes clusters'
    # node steps go through their API server.
    backends = ClusterBackends(redis, keys)
    broker_probe = MetadataProbe(settings)
    executor = Executor(settings, Journal(redis, keys), signer,
                        EventBus(broker, settings.namespace), redis, keys,
                        build_centre(settings, redis, keys), backends=backends,
                        broker_probe=broker_probe)
    subscribe(broker, settings, Topic.OPS_TASKS_SCHEDULED, "executor-tasks",
              executor.on_scheduled)
    subscribe(broker, settings, Topic.NODE_COMMAND_RESULTS, "executor-results", executor.on_result,
              seal=result_seal(settings))
    subscribe(broker, settings, Topic.OPS_TASK_CONTROL, "executor-control", executor.on_control)
    # Startup recovery (status queries for commands left unanswered) runs in the first
    # sweep, not as a starter: starters run before the broker can publish.
    return build_app(
        broker, settings,
        loops=[("deadline-sweep", settings.deadline_sweep_interval_s, executor.sweep_deadlines),
               ("backends-warm", settings.backend_warm_interval_s, backends.warm),
               ("locks-renew", settings.lock_renew_interval_s, executor.renew_locks)],
        closers=[executor.stop, backends.close, broker_probe.close, redis.aclose],
        dependencies=[checks.redis(redis)],
    )
