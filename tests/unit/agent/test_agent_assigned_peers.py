"""Peers the centre assigns: the set_peers command, the agent's own checks of the list, the
advertised address, and the partition fault."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent.commands import CommandExecutor
from agent.faults import FaultPlan, read_faults, write_faults
from agent.journal import Journal
from agent.peers import (
    PROBE_FILE,
    EchoListener,
    PeerProber,
    assigned_peers,
    format_address,
    parse_address,
    probe_peer,
    read_probe_addr,
)
from agent.settings import AgentSettings
from schemas.events.v1 import MAX_PEERS, Peer, SetPeers
from tests.unit.agent.conftest import CLUSTER, NODE


def peer(node: str, address: str) -> Peer:
    # Built without validation: the agent must hold even when the schema's checks did not.
    return Peer.model_construct(node_id=node, address=address)


def test_the_agent_checks_the_centre_s_list_again() -> None:
    listed = [
        peer("node-002", "127.0.0.2:4002"),
        peer("node-001", "127.0.0.1:4001"),  # itself
        peer("node-002", "127.0.0.3:4003"),  # twice: the first one counts
        peer("bad id!", "127.0.0.1:4004"),
        peer("node-005", "0.0.0.0:4005"),  # a wildcard is not an address to probe
        peer("node-006", "10.0.0.6:99999"),
        peer("node-007", "host.example:4007"),
        peer("node-008", "[::1]:4008"),
    ]
    assert assigned_peers("node-001", listed) == {
        "node-002": ("127.0.0.2", 4002),
        "node-007": ("host.example", 4007),
        "node-008": ("::1", 4008),
    }
    many = [peer(f"node-{n:03d}", f"127.0.0.1:{5000 + n}") for n in range(2, 40)]
    assert len(assigned_peers("node-001", many)) == MAX_PEERS


def test_set_peers_is_bounded_and_names_distinct_others() -> None:
    ok = SetPeers(node_id=NODE, peers=[Peer(node_id="node-002", address="127.0.0.2:4002")])
    assert ok.peers[0].address == "127.0.0.2:4002"
    for bad in (
        [Peer(node_id=NODE, address="127.0.0.1:1")],
        [Peer(node_id="node-002", address="127.0.0.1:1")] * 2,
        [Peer(node_id=f"node-{n:03d}", address="127.0.0.1:1") for n in range(2, 19)],
    ):
        with pytest.raises(ValidationError):
            SetPeers(node_id=NODE, peers=bad)
    for address in ("127.0.0.1", "127.0.0.1:0", "0.0.0.0:80", "a b:1", "300.1.1.1:2", "::1:80"):
        with pytest.raises(ValidationError):
            Peer(node_id="node-002", address=address)


def test_addresses_round_trip() -> None:
    for address in (("127.0.0.1", 80), ("::1", 9), ("node-2.example", 443)):
        assert parse_address(format_address(address)) == address
    assert parse_address("127.0.0.1:0") is None
    assert parse_address("nonsense") is None


def test_set_peers_from_the_centre_replaces_the_local_discovery(
    centre: Any, journal: Journal, state_dir: Path, now: datetime
) -> None:
    prober = PeerProber(NODE, state_dir.parent)
    executor = CommandExecutor(NODE, CLUSTER, centre.verifier, journal,
                               fault_plan=lambda: read_faults(state_dir),
                               set_peers=prober.assign)
    assert prober.assigned is None
    action = SetPeers(node_id=NODE, peers=[Peer(node_id="node-002", address="127.0.0.2:4002"),
                                           Peer(node_id="node-003", address="127.0.0.3:4003")])
    # Unordered, like a probe: seq 0, and it neither needs nor moves the node's sequence.
    result = executor.handle(centre.command(action, seq=0), now)
    assert result is not None
    assert (result.action, result.outcome) == ("set_peers", "succeeded")
    assert result.outputs == {"peers": 2, "refused": 0}
    assert prober.assigned == {"node-002": ("127.0.0.2", 4002), "node-003": ("127.0.0.3", 4003)}
    assert journal.last_seq is None
    # An agent that was given nowhere to put the list says so.
    bare = CommandExecutor(NODE, CLUSTER, centre.verifier, journal)
    refused = bare.handle(centre.command(action, seq=0), now)
    assert refused is not None
    assert (refused.outcome, refused.reason) == ("failed", "not_supported")


async def test_assigned_peers_are_probed_at_their_addresses(tmp_path: Path) -> None:
    # node-002 listens on a second loopback address that no sibling directory names.
    other = EchoListener(tmp_path / "elsewhere" / "node-002", host="127.0.0.2")
    address = await other.start()
    try:
        prober = PeerProber("node-001", tmp_path / "agents", count=3, timeout_s=10.0)
        assert await prober.probe_round() == []  # no siblings: nobody to probe
        prober.assign([Peer(node_id="node-002", address=format_address(address)),
                       Peer(node_id="node-009", address="127.0.0.1:1")])
        results = await prober.probe_round()
        assert [(p.peer_node_id, p.reachable) for p in results] == [
            ("node-002", True), ("node-009", False)]
    finally:
        await other.close()


async def test_a_partitioned_node_drops_probes_and_cannot_probe(tmp_path: Path) -> None:
    cut = {"off": False}
    listener = EchoListener(tmp_path / "node-002", cut_off=lambda: cut["off"])
    address = await listener.start()
    prober = PeerProber("node-002", tmp_path, timeout_s=10.0, cut_off=lambda: cut["off"])
    prober.assign([Peer(node_id="node-003", address=format_address(address))])
    try:
        assert (await probe_peer("node-002", address, timeout_s=10.0)).reachable
        assert [p.reachable for p in await prober.probe_round()] == [True]
        cut["off"] = True
        assert not (await probe_peer("node-002", address, timeout_s=10.0)).reachable
        assert [p.reachable for p in await prober.probe_round()] == [False]
    finally:
        await listener.close()


async def test_the_listener_advertises_the_configured_host(tmp_path: Path) -> None:
    listener = EchoListener(tmp_path / "node-001", host="0.0.0.0", advertise="127.0.0.1")
    host, port = await listener.start()
    try:
        assert listener.advertised() == f"127.0.0.1:{port}"
        assert read_probe_addr(tmp_path / "node-001" / PROBE_FILE) == ("127.0.0.1", port)
        assert (await probe_peer("node-001", (host, port), timeout_s=10.0)).reachable
    finally:
        await listener.close()


def test_settings_refuse_to_advertise_a_wildcard() -> None:
    def settings(**fields: str) -> AgentSettings:
        return AgentSettings.model_validate({"node_id": NODE, "cluster_id": CLUSTER, **fields})

    assert settings().advertised_probe_host() == "127.0.0.1"
    assert settings(probe_host="0.0.0.0",
                    probe_advertise="10.1.2.3").advertised_probe_host() == "10.1.2.3"
    assert settings(probe_host="::1").advertised_probe_host() == "::1"
    with pytest.raises(ValidationError):
        settings(probe_host="0.0.0.0")
    with pytest.raises(ValidationError):
        settings(probe_host="::")
    with pytest.raises(ValidationError):
        settings(probe_advertise="not a host")


def test_the_partition_fault_is_part_of_the_plan(state_dir: Path) -> None:
    write_faults(state_dir, FaultPlan(partitioned=True))
    assert read_faults(state_dir).partitioned
    assert not FaultPlan(partitioned=True).healthy
