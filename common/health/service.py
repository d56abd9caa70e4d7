"""What a FastStream service says of its own health: its phase, its background loops, its
broker's consumers and its dependencies; served on WARDEN_HEALTH_PORT (0: not served)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from faststream.kafka import KafkaBroker

from common.health import checks
from common.health.policy import Answer, Phase, liveness
from common.health.server import HealthServer
from common.settings import ServiceSettings


class ServiceHealth:
    """One service's liveness and readiness; `build_app` moves it through its phases."""

    def __init__(self, broker: KafkaBroker, settings: ServiceSettings,
                 dependencies: Sequence[checks.Dependency] = ()) -> None:
        self.phase = Phase.STARTING
        self._broker = broker
        self._timeout_s = settings.health_check_timeout_s
        # The broker first: every service consumes or publishes through it.
        self._dependencies = [checks.kafka(broker, settings.health_check_timeout_s),
                              *dependencies]
        self._loops: Sequence[asyncio.Task[None]] = ()
        self._server = (HealthServer(settings.health_host, settings.health_port,
                                     self.live, self.ready)
                        if settings.health_port else None)

    def watch(self, loops: Sequence[asyncio.Task[None]]) -> None:
        """The background loops whose end is a death (the list `build_app` fills)."""
        self._loops = loops

    async def live(self) -> Answer:
        ended = checks.ended_tasks(self._loops) + checks.ended_consumers(self._broker)
        return liveness(self.phase, ended)

    async def ready(self) -> Answer:
        return await checks.answer_readiness(self.phase, self._dependencies, self._timeout_s)

    async def open(self) -> None:
        if self._server is not None:
            await self._server.start()

    async def close(self) -> None:
        if self._server is not None:
            await self._server.close()
