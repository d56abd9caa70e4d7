"""Peer probes: each agent answers a TCP echo on 127.0.0.1 and probes a few of its peers.

An agent writes its listener's address to `<state dir>/probe.addr`; its peers are the
sibling state directories of the fleet (`<WARDEN_STATE_DIR>/agents/*`). A peer whose agent
is alive answers, even when the fault plan keeps it silent; a killed agent does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.settings import IDENTIFIER_PATTERN
from schemas.events.v1 import PeerProbe

log = logging.getLogger("clusterwarden.agent.peers")

PROBE_FILE = "probe.addr"
LOOPBACK = "127.0.0.1"
NONCE_BYTES = 16
ECHO_LIMIT = 1_024  # a probe is 32 bytes; anything longer is not one of ours
ECHO_IDLE_S = 5.0
MAX_PEERS = 16  # the schema's bound on NodeReport.peer_probes
MAX_RTT_MS = 600_000.0

Address = tuple[str, int]


def write_probe_addr(state_dir: Path, address: Address) -> Path:
    """Publish the listener's address atomically, so a peer never reads half of it."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / PROBE_FILE
    tmp = path.with_name(f".{PROBE_FILE}.{os.getpid()}.tmp")
    tmp.write_text(f"{address[0]}:{address[1]}\n")
    tmp.replace(path)
    return path


def read_probe_addr(path: Path) -> Address | None:
    """The address in a probe.addr file; None if it is missing or not an address."""
    try:
        host, _, port = path.read_text().strip().rpartition(":")
        number = int(port)
    except (OSError, ValueError):
        return None
    if not host or not 0 < number < 65_536:
        return None
    return host, number


def discover_peers(agents_dir: Path, node_id: str) -> dict[str, Address | None]:
    """Every other agent of the fleet that published an address (None: unreadable)."""
    pattern = re.compile(IDENTIFIER_PATTERN)
    peers: dict[str, Address | None] = {}
    for path in sorted(agents_dir.glob(f"*/{PROBE_FILE}")):
        peer = path.parent.name
        # The directory name becomes a peer id in a report, so it must be a valid one.
        if peer != node_id and pattern.fullmatch(peer):
            peers[peer] = read_probe_addr(path)
    return peers


def choose_peers(node_id: str, nodes: Sequence[str], count: int) -> list[str]:
    """Up to `count` peers: the ones after `node_id` in sorted order, wrapping around."""
    others = sorted(set(nodes) - {node_id})
    if count <= 0 or not others:
        return []
    # Each node watches its successors, so every node is watched by about `count` others.
    start = sum(1 for other in others if other < node_id)
    ring = others[start:] + others[:start]
    return ring[: min(count, MAX_PEERS)]


async def probe_peer(peer: str, address: Address | None, timeout_s: float) -> PeerProbe:
    """One connect + echo round trip; unreachable on any error, mismatch or timeout."""
    if address is None:
        return PeerProbe(peer_node_id=peer, reachable=False)
    nonce = secrets.token_hex(NONCE_BYTES // 2).encode()
    started = time.perf_counter()
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(*address)
            writer.write(nonce)
            await writer.drain()
            echoed = await reader.readexactly(len(nonce))
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return PeerProbe(peer_node_id=peer, reachable=False)
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    if echoed != nonce:
        # Something answers on that port, but not a peer agent (a reused port).
        return PeerProbe(peer_node_id=peer, reachable=False)
    rtt_ms = min(MAX_RTT_MS, (time.perf_counter() - started) * 1000.0)
    return PeerProbe(peer_node_id=peer, reachable=True, rtt_ms=round(rtt_ms, 3))


class EchoListener:
    """The agent's side of its peers' probes: echo what arrives, then close."""

    def __init__(self, state_dir: Path, port: int = 0, host: str = LOOPBACK) -> None:
        self.state_dir = state_dir
        self.host = host
        self.port = port
        self.address: Address | None = None
        self._server: asyncio.Server | None = None

    async def start(self) -> Address:
        """Listen, and publish the address in probe.addr."""
        if self._server is None:
            self._server = await asyncio.start_server(self._echo, self.host, self.port)
            host, port = self._server.sockets[0].getsockname()[:2]
            self.address = (str(host), int(port))
            write_probe_addr(self.state_dir, self.address)
            log.info("peer-probe listener on %s:%d", *self.address)
        assert self.address is not None
        return self.address

    async def _echo(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        echoed = 0
        try:
            while echoed < ECHO_LIMIT:
                async with asyncio.timeout(ECHO_IDLE_S):
                    data = await reader.read(ECHO_LIMIT - echoed)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
                echoed += len(data)
        except (OSError, TimeoutError):
            pass  # a prober that went away is not our problem
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def close(self) -> None:
        """Stop listening and withdraw the address (if it is still ours)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        await server.wait_closed()
        path = self.state_dir / PROBE_FILE
        if self.address is not None and read_probe_addr(path) == self.address:
            path.unlink(missing_ok=True)


class PeerProber:
    """Probes a few peers concurrently; the report carries the latest round's results."""

    def __init__(
        self, node_id: str, agents_dir: Path, *, count: int = 3, timeout_s: float = 1.0
    ) -> None:
        self.node_id = node_id
        self.agents_dir = agents_dir
        self.count = count
        self.timeout_s = timeout_s
        self._latest: list[PeerProbe] = []

    def latest(self) -> list[PeerProbe]:
        """The results of the last finished round."""
        return list(self._latest)

    async def probe_round(
        self, known: Mapping[str, Address | None] | None = None
    ) -> list[PeerProbe]:
        """Probe the chosen peers at once (so a dead one costs one timeout, not several)."""
        peers = discover_peers(self.agents_dir, self.node_id) if known is None else dict(known)
        chosen = choose_peers(self.node_id, list(peers), self.count)
        results = await asyncio.gather(
            *(probe_peer(peer, peers[peer], self.timeout_s) for peer in chosen)
        )
        self._latest = list(results)
        return self.latest()
