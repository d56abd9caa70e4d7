"""Executor wiring: `faststream run services.executor.app:create_app --factory`."""

from __future__ import annotations

from faststream import FastStream

from schemas.events.v1 import CommandResult, TaskScheduled
from schemas.topics import Topic, topic_name
from services.executor.handlers import Executor
from services.executor.journal import Journal
from services.executor.settings import ExecutorSettings
from services.shared.messaging import (
    EventBus,
    consumer_options,
    group_name,
    make_broker,
    strict_decoder,
)
from services.shared.redis_client import Keys, connect_redis
from services.shared.runtime import build_app
from services.shared.signing import local_signer
from services.shared.telemetry import setup_telemetry


def create_app(settings: ExecutorSettings | None = None) -> FastStream:
    settings = settings or ExecutorSettings()
    telemetry = setup_telemetry("executor")
    broker, _ = make_broker(settings, "executor", telemetry)
    redis = connect_redis(settings.redis_url)
    keys = Keys(settings.namespace)
    signer = local_signer(settings.signing_key, settings.state_dir)
    executor = Executor(settings, Journal(redis, keys), signer,
                        EventBus(broker, settings.namespace), redis, keys)
    limit = settings.max_message_bytes
    broker.subscriber(
        topic_name(Topic.OPS_TASKS_SCHEDULED, settings.namespace),
        decoder=strict_decoder(TaskScheduled, limit),
        **consumer_options(group_name(settings, "executor-tasks")),
    )(executor.on_scheduled)
    broker.subscriber(
        topic_name(Topic.NODE_COMMAND_RESULTS, settings.namespace),
        decoder=strict_decoder(CommandResult, limit),
        **consumer_options(group_name(settings, "executor-results")),
    )(executor.on_result)
    return build_app(
        broker, settings,
        loops=[("deadline-sweep", settings.deadline_sweep_interval_s, executor.sweep_deadlines)],
        closers=[redis.aclose],
    )
