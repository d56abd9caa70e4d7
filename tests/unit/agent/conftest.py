"""Fixtures for the agent tests: a signing centre with real keys, a journal, an executor;
and the polling helpers the tests wait with (a condition, never a fixed sleep)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Generic, TypeVar
from uuid import UUID, uuid4

import pytest

from agent.actions import JobActions
from agent.commands import CommandExecutor
from agent.faults import read_faults
from agent.jobs.runner import JobRunner
from agent.journal import Journal
from agent.store import CheckpointStore
from common.signing import (
    SIGNER_ACTIONS,
    SIGNER_ROLES,
    CommandSigner,
    CommandVerifier,
    ensure_signer_keys,
    signer_from_file,
    verifier_from_files,
)
from schemas.events.v1 import Action, Command, CommandPayload, CommandResult, DrainNode

NODE = "node-001"
CLUSTER = "local"
NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
@dataclass
class Centre:
    """Signs commands the way the centre will: each action with the key of the signer whose
    role may sign it (the executor's first)."""

    signers: dict[str, CommandSigner]
    public_keys: list[Path]
    verifier: CommandVerifier

    @property
    def signer(self) -> CommandSigner:
        return self.signers["executor"]

    def signer_for(self, action: str) -> CommandSigner:
        return next(self.signers[role] for role in SIGNER_ROLES
                    if action in SIGNER_ACTIONS[role])

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
        cluster: str = CLUSTER,
    ) -> CommandPayload:
        return CommandPayload(
            command_id=command_id or uuid4(),
            cluster_id=cluster,
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

    def sign(self, payload: CommandPayload, role: str | None = None) -> Command:
        """`payload` signed by `role`'s key, or by the signer its action belongs to."""
        signer = (self.signers[role] if role is not None
                  else self.signer_for(payload.action.action))
        return signer.sign(payload, source=role or "centre")

    def command(self, action: Action | None = None, **fields: Any) -> Command:
        return self.sign(self.payload(action, **fields))


@pytest.fixture
def centre(tmp_path: Path) -> Centre:
    public = ensure_signer_keys(tmp_path / "keys")
    signers = {p.stem: signer_from_file(p.with_suffix(".key")) for p in public}
    return Centre(signers, public, verifier_from_files(public))


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


# ---------------------------------------------------------------- nodes with jobs

J = TypeVar("J", bound=JobRunner)


@dataclass
class Node(Generic[J]):
    """One agent's executor, journal and jobs, as the agent wires them (without Kafka)."""

    node_id: str
    state_dir: Path
    journal: Journal
    jobs: J
    executor: CommandExecutor
    centre: Centre
    now: datetime
    published: list[CommandResult] = field(default_factory=list)
    seq: int = 0

    def send(
        self, action: Action, *, command_id: UUID | None = None, **fields: Any
    ) -> CommandResult | None:
        self.seq += 1
        command = self.centre.command(action, node=self.node_id, seq=self.seq,
                                      command_id=command_id or uuid4(), **fields)
        result = self.executor.handle(command, self.now)
        # As the agent does after every command: the jobs follow the mode at once.
        self.tend()
        return result

    def tend(self) -> None:
        """What the agent does between reports: the jobs follow the mode and the plan."""
        self.jobs.reconcile(self.journal.mode, read_faults(self.state_dir))

    def answer(self, action: Action, **fields: Any) -> CommandResult:
        result = self.send(action, **fields)
        assert result is not None, "expected an immediate answer"
        return result

    async def run(self, action: Action, **fields: Any) -> CommandResult:
        """Send a long action and wait for its published result."""
        command_id = uuid4()
        assert self.send(action, command_id=command_id, **fields) is None
        result = await self.executor.running()[command_id]
        assert self.published[-1] == result
        return result

    def job_ids(self) -> list[str]:
        return [view.job_id for view in self.jobs.views()]


def open_node(
    node_id: str,
    state_dir: Path,
    jobs: J,
    centre: Centre,
    now: datetime,
    store: CheckpointStore,
    *,
    gpus: int = 2,
    stop_timeout_s: float = 0.2,
) -> Node[J]:
    """A node whose long actions publish into `Node.published`."""
    journal = Journal.open(state_dir)
    published: list[CommandResult] = []

    async def publish(result: CommandResult) -> None:
        published.append(result)

    executor = CommandExecutor(
        node_id, CLUSTER, centre.verifier, journal,
        fault_plan=lambda: read_faults(state_dir),
        jobs=JobActions(node_id, gpus, jobs, store, poll_s=0.01, stop_timeout_s=stop_timeout_s),
        publish=publish,
    )
    return Node(node_id, state_dir, journal, jobs, executor, centre, now, published)
