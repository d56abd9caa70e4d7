"""Fixtures for the agent tests: a signing centre with real keys, a journal, an executor."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest

from agent.commands import CommandExecutor
from agent.faults import read_faults
from agent.journal import Journal
from schemas.events.v1 import Action, Command, CommandPayload, DrainNode
from services.shared.signing import (
    CommandSigner,
    CommandVerifier,
    ensure_keypair,
    signer_from_file,
    verifier_from_files,
)

NODE = "node-001"
CLUSTER = "local"
NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@dataclass
class Centre:
    """Signs commands the way the executor will."""

    signer: CommandSigner
    public_key: Path
    verifier: CommandVerifier

    def payload(
        self,
        action: Action | None = None,
        *,
        node: str = NODE,
        seq: int = 1,
        epoch: int = 1,
        issued_at: datetime = NOW,
        ttl_s: float = 60.0,
        dry_run: bool = False,
        command_id: UUID | None = None,
    ) -> CommandPayload:
        return CommandPayload(
            command_id=command_id or uuid4(),
            node_id=node,
            seq=seq,
            epoch=epoch,
            issued_at=issued_at,
            expires_at=issued_at + timedelta(seconds=ttl_s),
            task_id=uuid4(),
            step_index=0,
            dry_run=dry_run,
            action=action or DrainNode(node_id=node),
        )

    def sign(self, payload: CommandPayload, cluster: str = CLUSTER) -> Command:
        return self.signer.sign(payload, cluster_id=cluster, source="executor")

    def command(self, action: Action | None = None, **fields: Any) -> Command:
        return self.sign(self.payload(action, **fields))


@pytest.fixture
def centre(tmp_path: Path) -> Centre:
    private, public = ensure_keypair(tmp_path / "keys")
    return Centre(signer_from_file(private), public, verifier_from_files([public]))


@pytest.fixture
def now() -> datetime:
    """The agent's clock in these tests; commands are issued at this moment by default."""
    return NOW


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "agents" / NODE
    path.mkdir(parents=True)
    return path


@pytest.fixture
def journal(state_dir: Path) -> Iterator[Journal]:
    opened = Journal.open(state_dir)
    yield opened
    opened.close()


@pytest.fixture
def executor(centre: Centre, journal: Journal, state_dir: Path) -> CommandExecutor:
    return CommandExecutor(
        NODE,
        CLUSTER,
        centre.verifier,
        journal,
        leeway_s=30.0,
        max_ttl_s=300.0,
        fault_plan=lambda: read_faults(state_dir),
    )
