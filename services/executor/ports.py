"""The executor's narrow ports: what a centre action returns, and what the handlers call.

Centre actions (add/remove capacity, migrate jobs, release a node) are carried out by the
executor itself, not by an agent. The handlers only know this interface; the concrete
centre (cluster view, capacity provider, planning) is wired in `app.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol
from uuid import UUID

from schemas.envelope import Envelope
from schemas.events.v1 import OpsTask, OutputValue, Step
from schemas.topics import Topic


@dataclass(frozen=True)
class Completed:
    """The centre action is done; its outputs (initial/target resources...) join the step."""

    outputs: dict[str, OutputValue] = field(default_factory=dict)


@dataclass(frozen=True)
class Failed:
    """The centre action failed; `permanent` means a retry cannot help."""

    reason: str
    permanent: bool = False


@dataclass(frozen=True)
class Waiting:
    """The centre action split into child tasks; the step ends when the last child does.

    `outputs` (e.g. initial/target resources, the plan) join the step's outputs when it ends.
    """

    children: list[OpsTask]
    outputs: dict[str, OutputValue] = field(default_factory=dict)


CentreResult = Completed | Failed | Waiting


class GuardCheck(NamedTuple):
    """Whether a step's guard holds now, and why (or why not)."""

    holds: bool
    why: str


class CentreActions(Protocol):
    """Guards and centre actions, evaluated on fresh cluster state just before a step."""

    async def check_guard(self, task: OpsTask, step: Step) -> GuardCheck:
        """Whether the step's guard holds now, and why (or why not)."""
        ...

    async def run(self, task: OpsTask, index: int, command_id: UUID,
                  dry_run: bool) -> CentreResult:
        """Carry out step `index`; idempotent per `command_id` (a re-run repeats nothing)."""
        ...


class Publisher(Protocol):
    """Publishes events (the Kafka EventBus in production, a recorder in tests)."""

    async def publish(self, topic: Topic, event: Envelope) -> None: ...


class BackendSteps(Protocol):
    """Node steps of clusters whose backend is not the local agents (backend_steps.py)."""

    async def handles(self, task: OpsTask, step: Step) -> bool:
        """Whether the step goes through the task's cluster's backend (not an agent's
        command, nor the centre's local capacity provider)."""
        ...

    async def run(self, task: OpsTask, index: int, command_id: UUID,
                  dry_run: bool) -> CentreResult:
        """Carry out step `index` through the backend; idempotent (a resend changes
        nothing: every write carries the task and step, and re-reads before acting)."""
        ...


class LocalAgentsOnly:
    """No backend but the local agents: every node step is an agent's command."""

    async def handles(self, task: OpsTask, step: Step) -> bool:
        return False

    async def run(self, task: OpsTask, index: int, command_id: UUID,
                  dry_run: bool) -> CentreResult:
        return Failed("not_supported: no backend carries out this step", permanent=True)
