"""Peer probes: choosing peers, finding them in the fleet's state, and the echo round trip."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from agent.peers import (
    PROBE_FILE,
    EchoListener,
    PeerProber,
    choose_peers,
    discover_peers,
    probe_peer,
    read_probe_addr,
    write_probe_addr,
)
from tests.waiting import DEADLINE_S

NODES = ["node-001", "node-002", "node-003", "node-004", "node-005"]
T = TypeVar("T")


async def within(awaitable: Awaitable[T], what: str, timeout_s: float = DEADLINE_S) -> T:
    """Await something that must end on its own (not by its timeout); fail clearly if not."""
    try:
        async with asyncio.timeout(timeout_s):
            return await awaitable
    except TimeoutError:
        pytest.fail(f"{what}: still waiting after {timeout_s:g} s")


@pytest.mark.parametrize(
    ("me", "count", "expected"),
    [
        ("node-001", 3, ["node-002", "node-003", "node-004"]),
        ("node-004", 3, ["node-005", "node-001", "node-002"]),  # wraps around
        ("node-005", 2, ["node-001", "node-002"]),
        ("node-003", 10, ["node-004", "node-005", "node-001", "node-002"]),  # all there are
        ("node-003", 0, []),
        ("node-000", 2, ["node-001", "node-002"]),  # self not yet listed
        ("node-0035", 1, ["node-004"]),
    ],
)
def test_choose_peers(me: str, count: int, expected: list[str]) -> None:
    assert choose_peers(me, NODES, count) == expected


def test_every_node_is_watched_by_as_many_peers() -> None:
    watchers = {node: 0 for node in NODES}
    for node in NODES:
        for peer in choose_peers(node, NODES, 2):
            watchers[peer] += 1
    assert set(watchers.values()) == {2}


def test_choose_peers_alone_and_capped() -> None:
    assert choose_peers("node-001", ["node-001"], 3) == []
    many = [f"node-{n:03d}" for n in range(40)]
    assert len(choose_peers("node-000", many, 99)) == 16  # the schema's bound


def test_discover_peers(tmp_path: Path) -> None:
    write_probe_addr(tmp_path / "node-001", ("127.0.0.1", 4001))
    write_probe_addr(tmp_path / "node-002", ("127.0.0.1", 4002))
    (tmp_path / "node-003").mkdir()
    (tmp_path / "node-003" / PROBE_FILE).write_text("not an address")
    (tmp_path / "node-004").mkdir()  # no listener published (yet)
    write_probe_addr(tmp_path / "bad name!", ("127.0.0.1", 4005))
    assert discover_peers(tmp_path, "node-001") == {
        "node-002": ("127.0.0.1", 4002),
        "node-003": None,
    }
    assert discover_peers(tmp_path / "missing", "node-001") == {}


@pytest.mark.parametrize("text", ["", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", ":80"])
def test_bad_addresses(tmp_path: Path, text: str) -> None:
    (tmp_path / PROBE_FILE).write_text(text)
    assert read_probe_addr(tmp_path / PROBE_FILE) is None
    assert read_probe_addr(tmp_path / "absent") is None


async def test_a_live_listener_answers_and_a_closed_one_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listener = EchoListener(tmp_path / "node-002")
    address = await listener.start()
    assert read_probe_addr(tmp_path / "node-002" / PROBE_FILE) == address
    assert address[0] == "127.0.0.1"
    assert address[1] > 0
    probe = await probe_peer("node-002", address, timeout_s=10.0)
    assert probe.reachable
    assert probe.rtt_ms is not None
    assert 0.0 < probe.rtt_ms <= 10_000.0  # milliseconds, within the probe's timeout

    await listener.close()
    assert not (tmp_path / "node-002" / PROBE_FILE).exists()
    # Refused at once on loopback: the connect itself fails (not the timeout, far longer).
    errors: list[BaseException] = []
    connect = asyncio.open_connection

    async def watched(*args: Any, **kwargs: Any) -> Any:
        try:
            return await connect(*args, **kwargs)
        except BaseException as err:
            errors.append(err)
            raise

    monkeypatch.setattr(asyncio, "open_connection", watched)  # as probe_peer calls it
    dead = await within(probe_peer("node-002", address, timeout_s=3_600.0), "a refused probe")
    assert (dead.reachable, dead.rtt_ms) == (False, None)
    assert [type(err) for err in errors] == [ConnectionRefusedError]
    assert not (await probe_peer("node-002", None, timeout_s=3_600.0)).reachable


async def test_a_peer_that_never_answers_times_out(tmp_path: Path) -> None:
    writers: list[asyncio.StreamWriter] = []

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)  # accepts, reads nothing, answers nothing

    async def wrong(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await reader.read(64)
        writer.write(b"x" * 16)  # something answers, but it is not our echo
        await writer.drain()

    for handler in (mute, wrong):
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        address = server.sockets[0].getsockname()[:2]
        if handler is mute:
            # Nothing ever answers: only the timeout can end the probe (any timeout would).
            started = time.monotonic()
            probe = await within(probe_peer("node-009", address, timeout_s=0.3), "a mute peer")
            assert time.monotonic() - started >= 0.25  # it waited out its timeout
        else:
            # A wrong answer ends the probe when it arrives, not at the (hour-long) timeout.
            probe = await within(probe_peer("node-009", address, timeout_s=3_600.0),
                                 "a peer with a wrong answer")
        assert (probe.reachable, probe.rtt_ms) == (False, None)
        for writer in writers:
            writer.close()
            await writer.wait_closed()
        writers.clear()
        server.close()
        await server.wait_closed()


async def test_prober_probes_the_chosen_peers_concurrently(tmp_path: Path) -> None:
    listeners = [EchoListener(tmp_path / node) for node in NODES[1:4]]
    for listener in listeners:
        await listener.start()
    # node-005 published an address, but its agent is gone (killed: the file stays).
    write_probe_addr(tmp_path / "node-005", ("127.0.0.1", 1))
    try:
        prober = PeerProber("node-003", tmp_path, count=3, timeout_s=10.0)
        assert prober.latest() == []
        results = await prober.probe_round()
        assert [(p.peer_node_id, p.reachable) for p in results] == [
            ("node-004", True), ("node-005", False), ("node-002", True)
        ]
        assert prober.latest() == results
        # A wider round sees everyone but itself.
        everyone = await PeerProber("node-003", tmp_path, count=16, timeout_s=10.0).probe_round()
        assert sorted(p.peer_node_id for p in everyone) == ["node-002", "node-004", "node-005"]
    finally:
        for listener in listeners:
            await listener.close()


async def test_listener_on_a_fixed_port_and_idempotent_start(tmp_path: Path) -> None:
    first = EchoListener(tmp_path / "a")
    port = (await first.start())[1]
    assert await first.start() == ("127.0.0.1", port)
    await first.close()
    again = EchoListener(tmp_path / "b", port=port)
    assert (await again.start())[1] == port
    await again.close()
    await again.close()  # idempotent
