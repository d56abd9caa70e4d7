"""What the benchmark counts: the commands and round trips of the router's own Redis
connection, and a tap on its bus that tells the driver what went out."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.typing import EncodableT

from common.messaging import EventBus
from schemas.envelope import Envelope
from schemas.events.v1 import (
    Command,
    MlTaskOutcome,
    ModelSelected,
)
from schemas.topics import Topic

if TYPE_CHECKING:
    from bench.router_throughput.run import Driver


class ClientCount:
    """Commands and round trips sent by the connections of `CountingConnection`."""

    commands = 0
    round_trips = 0

    @classmethod
    def read(cls) -> tuple[int, int]:
        return cls.commands, cls.round_trips


class CountingConnection(Connection):
    """A redis-py connection that counts what it sends (one pipeline is one round trip)."""

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        ClientCount.commands += 1
        return super().pack_command(*args)

    async def send_packed_command(self, command: bytes | str | Iterable[bytes],
                                  check_health: bool = True) -> None:
        ClientCount.round_trips += 1
        await super().send_packed_command(command, check_health)


def connect_counted_redis(url: str) -> Redis:
    """`services.shared.redis_client.connect_redis`, with counted connections."""
    return Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0,
                          health_check_interval=15, decode_responses=False,
                          connection_class=CountingConnection)


class Tap(EventBus):
    """The router's bus: publishes through `inner` (the real broker; None: nowhere), then
    tells `listener` about each command and final outcome, with the time it went out."""

    def __init__(self, inner: EventBus | None) -> None:
        super().__init__(inner.broker if inner is not None else cast(Any, None),
                         inner.namespace if inner is not None else "")
        self.inner = inner
        self.listener: Driver | None = None
        self.published: Counter[Topic] = Counter()
        self.waits = 0
        self.timeouts = 0

    async def publish(self, topic: Topic, event: Envelope) -> None:
        if self.inner is not None:
            await self.inner.publish(topic, event)
        at = time.perf_counter()
        self.published[topic] += 1
        if isinstance(event, ModelSelected) and event.chosen is None:
            self.waits += 1
        elif isinstance(event, MlTaskOutcome):
            self.timeouts += event.cause == "timeout"
        if self.listener is not None:
            if isinstance(event, Command):
                self.listener.commanded(at, event)
            elif isinstance(event, MlTaskOutcome) and event.final:
                self.listener.finished(at, event)
