"""Service lifecycle: topics first, then the broker, then background loops; the reverse on stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Sequence

from faststream import FastStream
from faststream.kafka import KafkaBroker

from common.health.checks import Dependency
from common.health.policy import Phase
from common.health.service import ServiceHealth
from common.kafka_access import client_options
from common.messaging import ensure_topics
from common.observability import log_with_trace_ids, sample_period_s
from common.settings import ServiceSettings
from common.telemetry import shutdown_telemetry
from services.shared.consumer_lag import ConsumerLag

log = logging.getLogger("clusterwarden.runtime")


def configure_logging() -> None:
    """Readable INFO logs from ClusterWarden's own loggers (FastStream configures its own),
    each line with the trace and span it was written in."""
    log_with_trace_ids(os.getenv("WARDEN_LOG_LEVEL", "INFO"))

Tick = Callable[[], Awaitable[None]]


async def run_every(interval_s: float, tick: Tick, name: str) -> None:
    """Call `tick` every `interval_s`; a failing tick is logged and retried next time.

    A tick that cannot reach Redis fails, so it does nothing that round: fail closed.
    """
    while True:
        try:
            await tick()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s tick failed", name)
        await asyncio.sleep(interval_s)


def build_app(
    broker: KafkaBroker,
    settings: ServiceSettings,
    *,
    loops: Sequence[tuple[str, float, Tick]] = (),
    starters: Sequence[Callable[[], Awaitable[None]]] = (),
    closers: Sequence[Callable[[], Awaitable[None]]] = (),
    dependencies: Sequence[Dependency] = (),
) -> FastStream:
    """An app that creates its topics, runs `starters`, the broker, `loops`, then `closers`.

    Its health endpoints (with WARDEN_HEALTH_PORT) answer from the first moment to the last:
    ready once the loops run, while the broker and `dependencies` answer; alive while no loop
    or consumer has ended.
    """
    configure_logging()
    tasks: list[asyncio.Task[None]] = []
    health = ServiceHealth(broker, settings, dependencies)
    health.watch(tasks)

    async def create_topics() -> None:
        # First: a slow start-up (Kafka still coming up) answers "alive, starting".
        await health.open()
        await ensure_topics(settings.kafka_bootstrap_servers, settings.namespace,
                            security=client_options(settings))
        for starter in starters:
            await starter()

    # Every service's consumer lag, for the pipeline dashboard (docs/observability.md).
    lag = ("consumer-lag", sample_period_s(), ConsumerLag(broker).sample)

    async def start_loops() -> None:
        for name, interval, tick in (*loops, lag):
            tasks.append(asyncio.create_task(run_every(interval, tick, name), name=name))
        health.phase = Phase.RUNNING

    async def stop_loops() -> None:
        # Before the loops are cancelled: their end is no death, and no longer ready.
        health.phase = Phase.STOPPING
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        tasks.clear()

    async def close() -> None:
        try:
            for closer in closers:
                await closer()
            shutdown_telemetry()
        finally:
            await health.close()

    return FastStream(
        broker,
        on_startup=[create_topics],
        after_startup=[start_loops],
        on_shutdown=[stop_loops],
        after_shutdown=[close],
    )
