"""Whether the broker could be reached: now, and at any time since a given moment.

A step whose agent never answered fails as a timeout, and a timeout counts against its
breaker. But when the broker itself was hung or down for longer than the wait, the silence
says nothing about the step: the command, the answer or the status query was stuck in the
broker, not lost by the agent. So before the executor fails a wait for an agent, it asks the
broker for its metadata (an unreachable broker raises InfrastructureUnavailable: nothing is
failed, the sweep tries again), and whether any executor found the broker unreachable since
the wait began (the wait then starts over instead of failing).

The outage is remembered in Redis, not in the process, so every executor instance sees the
one another found, and a restart forgets nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from redis.asyncio import Redis

from common.clock import Clock, epoch_ms
from common.errors import InfrastructureUnavailable
from common.kafka_access import client_options
from common.settings import ServiceSettings
from services.shared.redis_client import Keys

log = logging.getLogger("clusterwarden.executor.broker")

# Longer than any wait for an agent (a step's timeout is at most an hour): an outage older
# than that cannot overlap a wait that is ending now.
OUTAGE_MEMORY_S: Final = 3_600
# How long the metadata request may take before the broker counts as unreachable.
PROBE_TIMEOUT_S: Final = 5.0
# What a broker that cannot be reached raises: the client's errors, the socket's, the clock's.
UNREACHABLE: Final = (KafkaError, OSError, TimeoutError)

BrokerProbe = Callable[[], Awaitable[None]]


async def always_reachable() -> None:
    """The probe of an executor built without a broker (in-process tests)."""


class MetadataProbe:
    """Asks the broker for its cluster metadata, over a client of its own (the consumers'
    connections may be healthy while the broker's request handling is hung, and vice versa)."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self._admin: AIOKafkaAdminClient | None = None

    async def __call__(self) -> None:
        try:
            if self._admin is None:
                admin = AIOKafkaAdminClient(**client_options(self.settings),
                                            request_timeout_ms=int(PROBE_TIMEOUT_S * 1000))
                self._admin = admin
                await admin.start()
            await self._admin.describe_cluster()
        except BaseException:
            # A client that timed out may hold a half-dead connection: start afresh next time.
            await self.close()
            raise

    async def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                await admin.close()


class BrokerHealth:
    """The broker's reachability, checked now and remembered across executors."""

    def __init__(self, redis: Redis, keys: Keys, clock: Clock,
                 probe: BrokerProbe = always_reachable,
                 timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.redis = redis
        self.keys = keys
        self.clock = clock
        self.probe = probe
        self.timeout_s = timeout_s

    async def unreachable_since(self, since_ms: int) -> bool:
        """Whether the broker was found unreachable at or after `since_ms` (epoch ms).
        Raises InfrastructureUnavailable if it cannot be reached now."""
        try:
            await asyncio.wait_for(self.probe(), self.timeout_s)
        except UNREACHABLE as err:
            await self.note_outage()
            raise InfrastructureUnavailable(f"the broker does not answer: {err!r}") from err
        seen = await self.redis.get(self.keys.broker_outage())
        return seen is not None and int(seen) >= since_ms

    async def note_outage(self) -> None:
        """Remember that the broker could not be reached now."""
        now_ms = epoch_ms(self.clock())
        log.warning("the broker could not be reached: waits for agents spanning now start over")
        await self.redis.set(self.keys.broker_outage(), now_ms, ex=OUTAGE_MEMORY_S)
