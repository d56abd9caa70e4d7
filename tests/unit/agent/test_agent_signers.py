"""The agent's answers by signer (docs/security.md): each key may sign its role's actions only,
a revoked key's commands are refused, a rotated key takes over without a restart, and a late
replay of an executed command is a duplicate, never `expired`."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.commands import CommandExecutor
from agent.journal import Journal
from common.signing import (
    ensure_keypair,
    key_id,
    load_public_key,
    signer_from_file,
    verifier_from_files,
)
from schemas.events.v1 import (
    DrainNode,
    OfflineNode,
    Peer,
    ProbeNode,
    SetPeers,
    SetReportInterval,
    UndrainNode,
)
from tests.unit.agent.conftest import CLUSTER, NODE
from tests.unit.agent.test_agent_commands import mode_of


@pytest.mark.parametrize(("role", "action"), [
    ("collector", DrainNode(node_id=NODE)),
    ("collector", OfflineNode(node_id=NODE)),
    ("router", DrainNode(node_id=NODE)),
    ("router", ProbeNode(node_id=NODE)),
])
def test_a_real_signature_of_a_signer_that_may_not_do_the_action_is_rejected(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime,
    role: str, action: Any,
) -> None:
    forged = centre.sign(centre.payload(action, seq=1), role=role)
    result = executor.handle(forged, now)
    assert result is not None
    assert (result.outcome, result.reason, result.action) == (
        "rejected", "action_not_allowed", action.action)
    assert journal.mode == "active"
    assert journal.last_seq is None  # it takes no place in the order either
    # Refused before the journal is read: its replay is refused again, never executed.
    again = executor.handle(forged, now)
    assert again is not None
    assert (again.outcome, again.reason) == ("rejected", "action_not_allowed")
    assert journal.mode == "active"


def test_each_signer_does_its_own_actions(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    collector = [centre.sign(centre.payload(a), role="collector") for a in (
        ProbeNode(node_id=NODE), SetReportInterval(node_id=NODE, interval_s=5.0),
        SetPeers(node_id=NODE, peers=[Peer(node_id="node-002", address="127.0.0.1:1")]))]
    drain = centre.sign(centre.payload(DrainNode(node_id=NODE), seq=1), role="executor")
    answers = [executor.handle(c, now) for c in [*collector, drain]]
    assert all(a is not None and a.reason != "action_not_allowed" for a in answers)
    assert journal.mode == "draining"
    assert journal.interval_s == 5.0


def rotating_executor(keys: Path, revoked: Path, journal: Journal) -> CommandExecutor:
    return CommandExecutor(NODE, CLUSTER, verifier_from_files([keys], revoked), journal)


def test_rotation_new_key_trusted_then_old_key_revoked_without_a_restart(
    centre: Any, journal: Journal, tmp_path: Path, now: datetime
) -> None:
    keys, revoked = tmp_path / "keys", tmp_path / "revoked-kids"
    executor = rotating_executor(keys, revoked, journal)
    old = centre.signers["executor"]
    drain = centre.sign(centre.payload(DrainNode(node_id=NODE), seq=1))
    assert executor.handle(drain, now).outcome == "succeeded"  # type: ignore[union-attr]

    # 1. the new key is given to the agents (a file beside the old one);
    private, public = ensure_keypair(keys, "executor.next")
    new = signer_from_file(private)
    assert new.kid == key_id(load_public_key(public)) != old.kid
    undrain = new.sign(centre.payload(UndrainNode(node_id=NODE), seq=2), "executor")
    assert executor.handle(undrain, now).outcome == "succeeded"  # type: ignore[union-attr]
    # 2. the old key still works while the signer switches;
    redrain = old.sign(centre.payload(DrainNode(node_id=NODE), seq=3), "executor")
    assert executor.handle(redrain, now).outcome == "succeeded"  # type: ignore[union-attr]

    # 3. the old key is revoked: its commands are answered, never executed.
    revoked.write_text(f"# rotated out\n{old.kid}\n")
    late = old.sign(centre.payload(UndrainNode(node_id=NODE), seq=4), "executor")
    refused = executor.handle(late, now)
    assert refused is not None
    assert (refused.outcome, refused.reason) == ("rejected", "revoked_kid")
    assert (journal.mode, journal.last_seq) == ("draining", 3)
    fresh = new.sign(centre.payload(UndrainNode(node_id=NODE), seq=5), "executor")
    assert executor.handle(fresh, now).outcome == "succeeded"  # type: ignore[union-attr]
    assert mode_of(journal) == "active"


def test_a_revoked_key_cannot_even_probe(
    centre: Any, journal: Journal, tmp_path: Path, now: datetime
) -> None:
    revoked = tmp_path / "revoked-kids"
    executor = rotating_executor(tmp_path / "keys", revoked, journal)
    probe = centre.sign(centre.payload(ProbeNode(node_id=NODE)), role="collector")
    revoked.write_text(centre.signers["collector"].kid + "\n")
    result = executor.handle(probe, now)
    assert result is not None
    assert (result.outcome, result.reason) == ("rejected", "revoked_kid")


def test_a_late_replay_of_an_executed_command_is_a_duplicate_not_expired(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    drain = centre.command(DrainNode(node_id=NODE), seq=1, ttl_s=60)
    first = executor.handle(drain, now)
    assert first is not None
    assert first.outcome == "succeeded"
    executor.handle(centre.command(UndrainNode(node_id=NODE), seq=2), now)
    assert journal.mode == "active"

    # Past expires_at and the leeway: a command never seen would be expired by now.
    late = now + timedelta(seconds=60 + 30 + 1)
    replay = executor.handle(drain, late)
    assert replay is not None
    assert (replay.outcome, replay.reason, replay.duplicate) == ("succeeded", "", True)
    assert replay.outputs == first.outputs
    assert journal.mode == "active"  # the drain did not run again
    never_seen = executor.handle(centre.command(OfflineNode(node_id=NODE), seq=3, ttl_s=60),
                                 late)
    assert never_seen is not None
    assert (never_seen.outcome, never_seen.reason) == ("rejected", "expired")
