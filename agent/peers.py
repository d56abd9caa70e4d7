"""Peer probes: each agent answers a TCP echo and probes a few of its peers.

The listener binds to AGENT_PROBE_HOST (127.0.0.1 unless told otherwise) and the agent
advertises where it answers (AGENT_PROBE_ADVERTISE, else the bound host) in every report.
The collector assigns each node its peers with their advertised addresses (a signed
`set_peers` command); until one arrives, and on a single host, the peers are the sibling
state directories of the fleet (`<WARDEN_STATE_DIR>/agents/*/probe.addr`). A peer whose agent
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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from agent.settings import IDENTIFIER_PATTERN
from common.ring import successors
from schemas.events.v1 import MAX_PEERS, Peer, PeerProbe, check_probe_address

log = logging.getLogger("clusterwarden.agent.peers")

PROBE_FILE = "probe.addr"
LOOPBACK = "127.0.0.1"
NONCE_BYTES = 16
ECHO_LIMIT = 1_024  # a probe is 32 bytes; anything longer is not one of ours
ECHO_IDLE_S = 5.0
MAX_RTT_MS = 600_000.0

Address = tuple[str, int]


def format_address(address: Address) -> str:
    """`host:port`, an IPv6 host in brackets (as a report's probe_address has it)."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(text: str) -> Address | None:
    """A `host:port` (strictly checked) as something to connect to; None if it is not one."""
    try:
        check_probe_address(text)
    except ValueError:
        return None
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def write_probe_addr(state_dir: Path, address: Address) -> Path:
    """Publish the listener's address atomically, so a peer never reads half of it."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / PROBE_FILE
    tmp = path.with_name(f".{PROBE_FILE}.{os.getpid()}.tmp")
    tmp.write_text(f"{format_address(address)}\n")
    tmp.replace(path)
    return path


def read_probe_addr(path: Path) -> Address | None:
    """The address in a probe.addr file; None if it is missing or not an address."""
    try:
        return parse_address(path.read_text().strip())
    except OSError:
        return None


def assigned_peers(node_id: str, peers: Sequence[Peer]) -> dict[str, Address]:
    """The centre's list as peers to probe: checked again here, whatever the centre sent.

    Only valid ids other than this node, each once, with a valid address, and never more
    than the schema's bound: an agent must not become a scanner of arbitrary addresses
    because of one bad list.
    """
    pattern = re.compile(IDENTIFIER_PATTERN)
    chosen: dict[str, Address] = {}
    for peer in peers:
        address = parse_address(peer.address)
        if (peer.node_id == node_id or peer.node_id in chosen or address is None
                or not pattern.fullmatch(peer.node_id)):
            continue
        chosen[peer.node_id] = address
        if len(chosen) == MAX_PEERS:
            break
    return chosen


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
    return successors(node_id, nodes, min(count, MAX_PEERS))


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
    """The agent's side of its peers' probes: echo what arrives, then close.

    `address` is where peers are told to connect: the advertised host (else the bound one)
    and the bound port.
    """

    def __init__(self, state_dir: Path, port: int = 0, host: str = LOOPBACK,
                 advertise: str = "", cut_off: Callable[[], bool] = lambda: False) -> None:
        self.state_dir = state_dir
        self.host = host
        self.port = port
        self.advertise = advertise
        # The fault plan's partition: probes arrive, and are dropped unanswered.
        self.cut_off = cut_off
        self.address: Address | None = None
        self._server: asyncio.Server | None = None

    async def start(self) -> Address:
        """Listen, and publish the advertised address in probe.addr."""
        if self._server is None:
            self._server = await asyncio.start_server(self._echo, self.host, self.port)
            host, port = self._server.sockets[0].getsockname()[:2]
            self.address = (self.advertise or str(host), int(port))
            write_probe_addr(self.state_dir, self.address)
            log.info("peer-probe listener on %s:%d, advertised as %s", host, port,
                     format_address(self.address))
        assert self.address is not None
        return self.address

    def advertised(self) -> str | None:
        """The report's probe_address: None until the listener runs."""
        return None if self.address is None else format_address(self.address)

    async def _echo(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        echoed = 0
        try:
            while echoed < ECHO_LIMIT and not self.cut_off():
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
        self, node_id: str, agents_dir: Path, *, count: int = 3, timeout_s: float = 1.0,
        cut_off: Callable[[], bool] = lambda: False,
    ) -> None:
        self.node_id = node_id
        self.cut_off = cut_off
        self.agents_dir = agents_dir
        self.count = count
        self.timeout_s = timeout_s
        self._latest: list[PeerProbe] = []
        # The centre's assignment, once it sent one: it replaces the local discovery.
        self._assigned: dict[str, Address] | None = None

    def latest(self) -> list[PeerProbe]:
        """The results of the last finished round."""
        return list(self._latest)

    def assign(self, peers: Sequence[Peer]) -> dict[str, Address]:
        """Probe these peers from the next round on (checked: see `assigned_peers`)."""
        self._assigned = assigned_peers(self.node_id, peers)
        log.info("peers assigned by the centre: %s",
                 ", ".join(f"{n}@{format_address(a)}" for n, a in self._assigned.items())
                 or "none")
        return dict(self._assigned)

    @property
    def assigned(self) -> dict[str, Address] | None:
        """The centre's assignment in force; None: the local discovery is used."""
        return None if self._assigned is None else dict(self._assigned)

    async def probe_round(
        self, known: Mapping[str, Address | None] | None = None
    ) -> list[PeerProbe]:
        """Probe the chosen peers at once (so a dead one costs one timeout, not several)."""
        if known is None and self._assigned is not None:
            # The centre chose them already (a ring over the cluster): probe them all.
            peers: dict[str, Address | None] = dict(self._assigned)
            chosen = list(peers)[:MAX_PEERS]
        else:
            peers = (discover_peers(self.agents_dir, self.node_id) if known is None
                     else dict(known))
            chosen = choose_peers(self.node_id, list(peers), self.count)
        if self.cut_off():
            # A partitioned node cannot reach its peers either (the fault plan says so).
            peers = dict.fromkeys(chosen)
        results = await asyncio.gather(
            *(probe_peer(peer, peers[peer], self.timeout_s) for peer in chosen)
        )
        self._latest = list(results)
        return self.latest()
