"""The health endpoints served in the process's own event loop, over asyncio streams.

Not uvicorn, though the API runs on it: its server takes SIGTERM and SIGINT over while it
serves, and in a FastStream service those are the runner's, for the graceful stop. Two fixed
endpoints need no framework either, and a bounded head read is all the input there is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from common.health import http
from common.health.policy import Answer

log = logging.getLogger("clusterwarden.health")

# The kubelet sends its request at once: a slower client holds a connection for nothing.
READ_TIMEOUT_S: Final = 2.0
WRITE_TIMEOUT_S: Final = 2.0
# Probes come one at a time per prober; more at once is somebody else, and waits for nothing.
MAX_CONNECTIONS: Final = 16

Endpoint = Callable[[], Awaitable[Answer]]


class HealthServer:
    """`/livez` and `/readyz` on host:port, answered by `live` and `ready`."""

    def __init__(self, host: str, port: int, live: Endpoint, ready: Endpoint, *,
                 read_timeout_s: float = READ_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.host, self.port = host, port
        self._endpoints = {http.Endpoint.LIVEZ: live, http.Endpoint.READYZ: ready}
        self._read_timeout_s = read_timeout_s
        self._max_connections = max_connections
        self._open = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen (a port taken or not allowed stops the service at start, with the error)."""
        # `limit` bounds what the reader buffers: a longer head fails the read, not the memory.
        self._server = await asyncio.start_server(self._serve, self.host, self.port,
                                                  limit=http.MAX_HEAD_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("health endpoints on %s:%d (/livez, /readyz)", self.host, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= self._max_connections:
            writer.transport.abort()
            return
        self._open += 1
        try:
            response = await self._respond(reader)
            if response:
                writer.write(response)
                async with asyncio.timeout(WRITE_TIMEOUT_S):
                    await writer.drain()
        except (OSError, TimeoutError):
            pass  # the prober went away or stopped reading: nobody is left to answer
        finally:
            self._open -= 1
            writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(WRITE_TIMEOUT_S):
                    await writer.wait_closed()

    async def _respond(self, reader: asyncio.StreamReader) -> bytes:
        """The response to the request `reader` brings ("" when the client sent nothing)."""
        try:
            async with asyncio.timeout(self._read_timeout_s):
                head = await reader.readuntil(http.END_OF_HEAD)
        except TimeoutError:
            return http.render(http.TOO_SLOW)
        except asyncio.LimitOverrunError:
            return http.render(http.TOO_LARGE)
        except asyncio.IncompleteReadError:
            return b""
        route = http.route(head)
        answer = (route.target if isinstance(route.target, Answer)
                  else await self._endpoints[route.target]())
        return http.render(answer, head_only=route.head_only)
