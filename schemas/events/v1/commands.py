"""Signed commands to an agent and its answers (including the answer to one ML task)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

from pydantic import AwareDatetime, Field, model_validator

from schemas.envelope import (
    ClusterId,
    Envelope,
    Identifier,
    SchemaMinor,
    ShortText,
    Strict,
    Versioned,
    written_at_minor,
)
from schemas.events.v1.actions import Action, ActionName
from schemas.events.v1.values import (
    Attempt,
    InferenceCause,
    ModelVersion,
    OutputValue,
    Seq,
    StepIndex,
)

# The seq of a command outside the node's command ordering (see CommandPayload.for_action).
UNORDERED_SEQ = 0


class CommandPayload(Versioned):
    """What an agent executes; signed by the centre and verified by the agent before acting.

    Parsed on its own from the signed bytes, so it carries its own minor version: an agent
    that knows an older one ignores a newer action's unknown fields, never before the
    signature over the exact bytes has verified.
    """

    command_id: UUID
    # The audience is a node of one cluster: two clusters may both have a `node-001`, and
    # the seq and epoch a command carries are those of its cluster's node.
    cluster_id: ClusterId
    node_id: Identifier
    seq: Seq
    epoch: Annotated[int, Field(ge=1, le=2**63 - 1)]
    issued_at: AwareDatetime
    expires_at: AwareDatetime
    task_id: UUID | None = None
    step_index: StepIndex | None = None
    dry_run: bool = False
    action: Action
    schema_minor: SchemaMinor = written_at_minor(0)

    @classmethod
    def for_action(cls, action: Action, *, cluster_id: str, command_id: UUID,
                   issued_at: datetime, expires_at: datetime, seq: int | None = None,
                   epoch: int = 1, task_id: UUID | None = None, step_index: int | None = None,
                   dry_run: bool = False) -> CommandPayload:
        """The payload carrying `action` to its node.

        `seq` is the next command sequence number of the node in `cluster_id` for an ordered
        command. An unordered command (a probe, a status query, a report interval, an inference; the
        agent's UNORDERED_ACTIONS) leaves it out and gets seq 0: agents neither check nor
        advance it. `epoch` fences a task's commands; 1 for a command outside any task.
        """
        return cls(command_id=command_id, cluster_id=cluster_id, node_id=action.node_id,
                   seq=UNORDERED_SEQ if seq is None else seq, epoch=epoch,
                   issued_at=issued_at, expires_at=expires_at, task_id=task_id,
                   step_index=step_index, dry_run=dry_run, action=action)

    @model_validator(mode="after")
    def _action_for_this_node(self) -> CommandPayload:
        if self.action.node_id != self.node_id:
            raise ValueError("action.node_id must equal node_id")
        if self.expires_at <= self.issued_at:
            raise ValueError("expires_at must be after issued_at")
        return self


class Command(Envelope):
    """A signed command. `payload` is the exact signed bytes (base64url of canonical JSON)."""

    event_type: Literal["command"] = "command"
    kid: Identifier
    alg: Literal["ed25519"] = "ed25519"
    payload: Annotated[str, Field(min_length=1, max_length=16_384, pattern=r"^[A-Za-z0-9_-]+$")]
    sig: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_-]+$")]


class InferenceOutput(Strict):
    """What running one ML task on a node gave: the answer, or the cause of the failure."""

    task_id: UUID
    attempt: Attempt
    task_type: Identifier
    model: Identifier
    version: ModelVersion
    family: Identifier | None = None
    cause: InferenceCause | None = Field(default=None, description="None when it succeeded.")
    latency_ms: Annotated[float, Field(ge=0.0, le=3_600_000.0)] = Field(
        description="Time spent on the node, from the command's arrival to its answer.")
    prediction: Annotated[int, Field(ge=-(2**31), le=2**31)] | None = None
    confidence: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    detail: ShortText = ""


class CommandResult(Envelope):
    """An agent's answer to a command (or its cached answer to a duplicate)."""

    event_type: Literal["command_result"] = "command_result"
    command_id: UUID
    node_id: Identifier
    task_id: UUID | None = None
    step_index: StepIndex | None = None
    action: ActionName | None = None
    outcome: Literal["succeeded", "failed", "rejected", "unknown"]
    reason: ShortText = ""
    duplicate: bool = False
    outputs: dict[Identifier, OutputValue] = Field(default_factory=dict, max_length=32)
    inference: InferenceOutput | None = Field(
        default=None, description="run_inference only: the task's answer or failure cause.")
