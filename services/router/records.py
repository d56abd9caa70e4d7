"""The router's record of one ML task in Redis: its attempts, and what it still has to send.

Every change is a compare-and-set of the whole record (WATCH on its key). Events are never
sent from inside a change: a change appends them to the record's outbox, and they are
published after it committed, then removed. A router that dies in between leaves them in the
outbox, and whoever looks at the task next publishes them: the same bytes, so consumers
dedupe them by event id.
"""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from schemas.events.v1 import InferenceCause, MlTaskSubmitted, SelectionStatus
from schemas.topics import Topic

RecordState = Literal["routing", "waiting", "running", "succeeded", "failed"]
AttemptState = Literal["dispatched", "ended"]
FINAL: frozenset[str] = frozenset({"succeeded", "failed"})

_CONFIG = ConfigDict(extra="forbid")


class Outbound(BaseModel):
    """One event to publish: its topic and its exact bytes (JSON)."""

    model_config = _CONFIG

    topic: Topic
    body: str


class AttemptResult(BaseModel):
    """How an attempt ended (as the agent answered, or as the router timed it out)."""

    model_config = _CONFIG

    cause: InferenceCause | None
    ended_at: float
    node_latency_ms: float | None = None
    prediction: int | None = None
    confidence: float | None = None
    detail: str = ""


class AttemptRecord(BaseModel):
    """One attempt: the arm chosen, the command sent, and how it ended."""

    model_config = _CONFIG

    n: Annotated[int, Field(ge=1)]
    model: str = Field(description="The model's name (without its version).")
    version: str
    family: str
    node: str
    predecessor: str | None = None
    command_id: UUID
    decided_at: float
    deadline: float
    retry: bool = Field(description="A retry: it counts in the task type's retry budget.")
    state: AttemptState = "dispatched"
    result: AttemptResult | None = None
    stats_recorded: bool = False


class TaskRecord(BaseModel):
    """The router's whole view of one task."""

    model_config = _CONFIG

    task: MlTaskSubmitted
    state: RecordState = "routing"
    attempts: list[AttemptRecord] = Field(default_factory=list)
    next_attempt: Annotated[int, Field(ge=1)] = 1
    avoid: dict[str, list[str]] = Field(
        default_factory=dict, description="What the next attempt avoids (policy Avoid).")
    wait_status: SelectionStatus | None = Field(
        default=None, description="The last waiting decision published for next_attempt.")
    outbox: list[Outbound] = Field(default_factory=list)
    trace_context: str = Field(
        default="", description="The submission's trace context (packed, common/tracing.py): "
        "every step of the task, from any handler or the sweep, is a span of that trace.")

    @property
    def current(self) -> AttemptRecord | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def final(self) -> bool:
        return self.state in FINAL

    def attempt_of(self, command_id: UUID) -> AttemptRecord | None:
        return next((a for a in self.attempts if a.command_id == command_id), None)

    def span_attributes(self) -> dict[str, str | int]:
        """What the task's spans say about it."""
        return {"ml.task.id": str(self.task.task_id), "ml.task.type": self.task.task_type,
                "cluster.id": self.task.cluster_id, "ml.state": self.state,
                "ml.attempts": len(self.attempts)}


def record_ttl_s(record: TaskRecord, now: float, finished_ttl_s: int, longest_s: int) -> int:
    """How long a task's record is kept from a save at `now` (epoch seconds).

    Unfinished, up to `longest_s`: the router ends every task by its deadline, and the sweep
    looks at every one long before that. Finished, the record is only what recognises a
    redelivered submission (and what `warden ml` shows): it is kept `finished_ttl_s` past the
    later of now and the task's deadline, so a submission delivered again after it is gone
    finds its deadline passed and fails at once instead of running twice. Records are the
    router's largest family by far, written at the routing rate: kept a day each, they would
    hold a day of tasks.
    """
    if not record.final:
        return longest_s
    until_deadline = max(0.0, record.task.deadline.timestamp() - now)
    return min(longest_s, int(until_deadline) + finished_ttl_s)
