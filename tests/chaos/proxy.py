"""A TCP proxy a test can partition: in front of a server, it forwards both ways until told to
black-hole (connections stay open and nothing gets through, as behind a firewall that drops
packets: what was sent waits, as TCP would retransmit it, and arrives once healed) or to reset
(every connection is closed, as after a failover). New connections made while it black-holes
are accepted and then hear nothing."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field


@dataclass
class PartitionProxy:
    """Listens on 127.0.0.1:<port> and forwards to `target_host`:`target_port`."""

    target_host: str
    target_port: int
    _open: asyncio.Event = field(default_factory=asyncio.Event)  # set: traffic flows
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> None:
        self._open.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.sockets[0].getsockname()[1])

    def black_hole(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    def reset(self) -> None:
        """Close every connection (clients see their connection end and reconnect)."""
        for writer in list(self._writers):
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self.reset()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _serve(self, client_in: asyncio.StreamReader,
                     client_out: asyncio.StreamWriter) -> None:
        try:
            server_in, server_out = await asyncio.open_connection(self.target_host,
                                                                  self.target_port)
        except OSError:
            client_out.close()
            return
        self._writers |= {client_out, server_out}
        pumps = [asyncio.create_task(self._pump(client_in, server_out)),
                 asyncio.create_task(self._pump(server_in, client_out))]
        self._tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
                self._tasks.discard(pump)
            for writer in (client_out, server_out):
                writer.close()
                self._writers.discard(writer)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while data := await source.read(65_536):
            await self._open.wait()  # black-holed: held, and the other side hears nothing
            sink.write(data)
            await sink.drain()
