"""The task store's tables (SQLAlchemy 2 declarative models); migrations/ creates them.

`transitions` is the log: one row per TaskEvent, unique by event id, never changed. `tasks`
and `steps` are what the recorder derives from it, recomputed from a task's whole log on
each new event, so they do not depend on the order events arrived in. `audit` is
append-only and hash-chained; `audit_head` holds the last hash, the entry count and their MAC
under the audit key, moved in the same transaction as each append.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final
from uuid import UUID

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    Uuid,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a bigint identity.
AutoId = BigInteger().with_variant(Integer(), "sqlite")

# Step state before any event of the step arrived (not a StepState of the events).
STEP_PENDING: Final = "pending"


class UTCDateTime(TypeDecorator[datetime]):
    """An aware UTC datetime on both engines.

    PostgreSQL's timestamptz keeps the offset; SQLite has no datetime type and would hand
    back naive values, so UTC is stored there without an offset and put back on reading.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: every time in the store is aware UTC")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None,
                             dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    """The task store's metadata."""

    # Named constraints: a later migration can drop or alter them by name on both engines
    # (SQLite's batch mode cannot find an unnamed one).
    metadata = MetaData(naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    })


class Task(Base):
    """An ops task (or child task). Plan fields are None while only a stub exists."""

    __tablename__ = "tasks"

    task_id: Mapped[UUID] = mapped_column(Uuid, primary_key=True)
    # No foreign key: a child's events may be recorded before its parent's.
    parent_task_id: Mapped[UUID | None] = mapped_column(Uuid, index=True)
    cluster_id: Mapped[str] = mapped_column(String(128), index=True)
    pool: Mapped[str | None] = mapped_column(String(128))
    target: Mapped[str | None] = mapped_column(String(128), index=True)
    need_id: Mapped[UUID | None] = mapped_column(Uuid)
    need_kind: Mapped[str | None] = mapped_column(String(32))
    kind: Mapped[str | None] = mapped_column(String(128))
    template: Mapped[str | None] = mapped_column(String(128))
    priority: Mapped[int | None] = mapped_column(Integer)
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(String(256), default="")
    evidence: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    plan: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    step_count: Mapped[int | None] = mapped_column(Integer)
    current_step: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class StepRecord(Base):
    """One step of a task: the plan's step and what its events said."""

    __tablename__ = "steps"

    task_id: Mapped[UUID] = mapped_column(
        Uuid, ForeignKey("tasks.task_id", ondelete="CASCADE"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str | None] = mapped_column(String(128))
    action: Mapped[str | None] = mapped_column(String(64))
    action_args: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    guard: Mapped[str | None] = mapped_column(String(64))
    # The node the step's action is about, if any: what the node filter finds tasks by.
    node_id: Mapped[str | None] = mapped_column(String(128), index=True)
    timeout_s: Mapped[float | None] = mapped_column(Float)
    max_attempts: Mapped[int | None] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), default=STEP_PENDING)
    command_id: Mapped[UUID | None] = mapped_column(Uuid)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    outputs: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    reason: Mapped[str] = mapped_column(String(256), default="")


class Transition(Base):
    """One TaskEvent as received: who moved the task (or a step) from what to what, and why."""

    __tablename__ = "transitions"
    __table_args__ = (Index("ix_transitions_task_order", "task_id", "occurred_at", "id"),)

    id: Mapped[int] = mapped_column(AutoId, primary_key=True, autoincrement=True)
    # The dedupe key: a replayed event finds its id taken and changes nothing.
    event_id: Mapped[UUID] = mapped_column(Uuid, unique=True)
    task_id: Mapped[UUID] = mapped_column(
        Uuid, ForeignKey("tasks.task_id", ondelete="CASCADE"))
    occurred_at: Mapped[datetime] = mapped_column(UTCDateTime)
    state: Mapped[str] = mapped_column(String(16))
    previous_state: Mapped[str | None] = mapped_column(String(16))
    step_index: Mapped[int | None] = mapped_column(Integer)
    step_state: Mapped[str | None] = mapped_column(String(16))
    command_id: Mapped[UUID | None] = mapped_column(Uuid)
    actor: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(String(256), default="")
    outputs: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class AuditEntry(Base):
    """An audited action. Append-only: h_i = SHA-256(h_{i-1} || canonical entry_i)."""

    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(AutoId, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    actor: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(32))
    action: Mapped[str] = mapped_column(String(128))
    target: Mapped[str] = mapped_column(String(256))
    reason: Mapped[str] = mapped_column(String(500))
    result: Mapped[str] = mapped_column(String(256))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON)
    # Unique: two appends chained to the same entry (a forked chain) cannot both commit.
    prev_hash: Mapped[str] = mapped_column(String(64), unique=True)
    hash: Mapped[str] = mapped_column(String(64), unique=True)


class AuditHead(Base):
    """The chain's head (one row, id 1): a cut-off tail leaves it pointing past the end, and
    a head rewritten to match fails its MAC (services/store/audit.py)."""

    __tablename__ = "audit_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hash: Mapped[str] = mapped_column(String(64))
    count: Mapped[int] = mapped_column(BigInteger)
    # HMAC-SHA256 under the audit key, hex; None: not keyed (a new log, or one from before).
    mac: Mapped[str | None] = mapped_column(String(64), nullable=True)


# ------------------------------------------------------------------ ML tasks


class MlTask(Base):
    """An ML task: what was asked, where it ran, how it ended. Derived from `ml_events`."""

    __tablename__ = "ml_tasks"

    task_id: Mapped[UUID] = mapped_column(Uuid, primary_key=True)
    cluster_id: Mapped[str] = mapped_column(String(128), index=True)
    task_type: Mapped[str | None] = mapped_column(String(128), index=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    priority: Mapped[int | None] = mapped_column(Integer)
    critical: Mapped[bool] = mapped_column(Boolean, default=False)
    submitted_by: Mapped[str | None] = mapped_column(String(128))
    deadline: Mapped[datetime | None] = mapped_column(UTCDateTime)
    input: Mapped[list[float] | None] = mapped_column(JSON)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # The latest attempt's target (the one that answered, for a finished task).
    node_id: Mapped[str | None] = mapped_column(String(128), index=True)
    model: Mapped[str | None] = mapped_column(String(128), index=True)
    version: Mapped[str | None] = mapped_column(String(32))
    family: Mapped[str | None] = mapped_column(String(128))
    cause: Mapped[str | None] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(String(256), default="")
    prediction: Mapped[int | None] = mapped_column(BigInteger)
    confidence: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class MlAttempt(Base):
    """One attempt of an ML task: the decision behind it and how it ended."""

    __tablename__ = "ml_attempts"

    task_id: Mapped[UUID] = mapped_column(
        Uuid, ForeignKey("ml_tasks.task_id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    node_id: Mapped[str | None] = mapped_column(String(128), index=True)
    model: Mapped[str | None] = mapped_column(String(128))
    version: Mapped[str | None] = mapped_column(String(32))
    family: Mapped[str | None] = mapped_column(String(128))
    command_id: Mapped[UUID | None] = mapped_column(Uuid)
    probe: Mapped[bool] = mapped_column(Boolean, default=False)
    decision_reason: Mapped[str] = mapped_column(String(256), default="")
    # Every candidate the decision saw: statistics, eligibility and why, score.
    candidates: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    outcome: Mapped[str | None] = mapped_column(String(16))
    cause: Mapped[str | None] = mapped_column(String(32))
    attributed_to: Mapped[str | None] = mapped_column(String(16))
    latency_ms: Mapped[float | None] = mapped_column(Float)
    node_latency_ms: Mapped[float | None] = mapped_column(Float)
    prediction: Mapped[int | None] = mapped_column(BigInteger)
    confidence: Mapped[float | None] = mapped_column(Float)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    reason: Mapped[str] = mapped_column(String(256), default="")


class MlEvent(Base):
    """One ML event as received (submission, decision, outcome): the log, never changed."""

    __tablename__ = "ml_events"
    __table_args__ = (Index("ix_ml_events_task_order", "task_id", "occurred_at", "id"),)

    id: Mapped[int] = mapped_column(AutoId, primary_key=True, autoincrement=True)
    event_id: Mapped[UUID] = mapped_column(Uuid, unique=True)
    task_id: Mapped[UUID] = mapped_column(
        Uuid, ForeignKey("ml_tasks.task_id", ondelete="CASCADE"))
    event_type: Mapped[str] = mapped_column(String(32))
    occurred_at: Mapped[datetime] = mapped_column(UTCDateTime)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)


class AlertRecord(Base):
    """One alert of a cluster, by its dedup key: its state now (firing or resolved), who
    acknowledged it, and what Alertmanager and the webhooks have been told."""

    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_status_updated", "status", "updated_at"),)

    cluster_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    dedup_key: Mapped[str] = mapped_column(String(128), primary_key=True)
    kind: Mapped[str] = mapped_column(String(128))
    severity: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    subject: Mapped[str] = mapped_column(String(256))
    source: Mapped[str] = mapped_column(String(128))
    message: Mapped[str] = mapped_column(String(256))
    # What ended it (the resolving event's message); None while it fires.
    resolution: Mapped[str | None] = mapped_column(String(256))
    starts_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_event_id: Mapped[UUID] = mapped_column(Uuid)
    # Firing events seen since it last started (a breaker re-raising it counts).
    occurrences: Mapped[int] = mapped_column(Integer)
    acknowledged_by: Mapped[str | None] = mapped_column(String(128))
    acknowledged_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ack_reason: Mapped[str | None] = mapped_column(String(256))
    # When Alertmanager last accepted this state; None: it has not (send again).
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The last change (raised, repeated, resolved, raised_again, acknowledged), for webhooks.
    last_change: Mapped[str] = mapped_column(String(16))
    # True while that change has not reached every webhook yet.
    webhook_pending: Mapped[bool] = mapped_column(Boolean, default=False)


class CapacityPlanRecord(Base):
    """One published capacity plan of a pool (a CapacityPlan event), kept as it was sent: the
    columns a list needs, the plan itself in `body`."""

    __tablename__ = "capacity_plans"
    __table_args__ = (Index("ix_capacity_plans_pool_generated", "cluster_id", "pool",
                            "generated_at"),)

    event_id: Mapped[UUID] = mapped_column(Uuid, primary_key=True)
    cluster_id: Mapped[str] = mapped_column(String(128))
    pool: Mapped[str] = mapped_column(String(128))
    generated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    horizon_days: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(256))
    leaves_range_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Nodes and GPUs of every procurement step, added up.
    nodes_to_add: Mapped[int] = mapped_column(Integer)
    gpus_to_add: Mapped[int] = mapped_column(Integer)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)


# ------------------------------------------------------------------ templates


class TemplateVersion(Base):
    """One version of a task template, never changed: its text and where it came from
    (builtin, manual, tuned, rollback), who made it, why, and the evidence of a tuned one."""

    __tablename__ = "template_versions"
    __table_args__ = (Index("ix_template_versions_name_version", "name", "version",
                            unique=True),)

    id: Mapped[int] = mapped_column(AutoId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(32))
    version: Mapped[int] = mapped_column(Integer)
    need: Mapped[str] = mapped_column(String(32))
    yaml: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    origin: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(String(500))
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class TemplateState(Base):
    """A template's current state: the version the templater runs, and whether it is pinned
    (a pinned template is never tuned)."""

    __tablename__ = "template_state"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    active_version: Mapped[int] = mapped_column(Integer)
    pinned: Mapped[bool] = mapped_column(Boolean, default=False)
    pinned_by: Mapped[str | None] = mapped_column(String(128))
    pin_reason: Mapped[str | None] = mapped_column(String(500))
    pinned_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
