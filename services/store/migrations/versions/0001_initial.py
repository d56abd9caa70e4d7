"""Tasks, steps, transitions and the hash-chained audit log.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The chain's first predecessor (as in services.shared.audit), spelt out: a migration must
# not change when application code does.
GENESIS = "0" * 64

AUTO_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    _tasks()
    _steps()
    _transitions()
    _audit()
    _audit_head()


def _tasks() -> None:
    """The tasks, indexed by what the API filters and sorts them on."""
    op.create_table(
        "tasks",
        sa.Column("task_id", sa.Uuid(), nullable=False),
        sa.Column("parent_task_id", sa.Uuid(), nullable=True),
        sa.Column("cluster_id", sa.String(128), nullable=False),
        sa.Column("pool", sa.String(128), nullable=True),
        sa.Column("target", sa.String(128), nullable=True),
        sa.Column("need_id", sa.Uuid(), nullable=True),
        sa.Column("need_kind", sa.String(32), nullable=True),
        sa.Column("kind", sa.String(128), nullable=True),
        sa.Column("template", sa.String(128), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=True),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(256), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=True),
        sa.Column("step_count", sa.Integer(), nullable=True),
        sa.Column("current_step", sa.Integer(), nullable=True),
        sa.Column("created_at", utc(), nullable=False),
        sa.Column("updated_at", utc(), nullable=False),
        sa.Column("finished_at", utc(), nullable=True),
        sa.PrimaryKeyConstraint("task_id", name=op.f("pk_tasks")),
    )
    for column in ("cluster_id", "created_at", "parent_task_id", "state", "target"):
        op.create_index(op.f(f"ix_tasks_{column}"), "tasks", [column])


def _steps() -> None:
    """The steps of each task's plan, by task and index."""
    op.create_table(
        "steps",
        sa.Column("task_id", sa.Uuid(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(128), nullable=True),
        sa.Column("action", sa.String(64), nullable=True),
        sa.Column("action_args", sa.JSON(), nullable=True),
        sa.Column("guard", sa.String(64), nullable=True),
        sa.Column("node_id", sa.String(128), nullable=True),
        sa.Column("timeout_s", sa.Float(), nullable=True),
        sa.Column("max_attempts", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("command_id", sa.Uuid(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("outputs", sa.JSON(), nullable=False),
        sa.Column("started_at", utc(), nullable=True),
        sa.Column("ended_at", utc(), nullable=True),
        sa.Column("reason", sa.String(256), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.task_id"],
                                name=op.f("fk_steps_task_id_tasks"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("task_id", "index", name=op.f("pk_steps")),
    )
    op.create_index(op.f("ix_steps_node_id"), "steps", ["node_id"])


def _transitions() -> None:
    """Every state change of a task or step, in order."""
    op.create_table(
        "transitions",
        sa.Column("id", AUTO_ID, autoincrement=True, nullable=False),
        sa.Column("event_id", sa.Uuid(), nullable=False),
        sa.Column("task_id", sa.Uuid(), nullable=False),
        sa.Column("occurred_at", utc(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("previous_state", sa.String(16), nullable=True),
        sa.Column("step_index", sa.Integer(), nullable=True),
        sa.Column("step_state", sa.String(16), nullable=True),
        sa.Column("command_id", sa.Uuid(), nullable=True),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("reason", sa.String(256), nullable=False),
        sa.Column("outputs", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.task_id"],
                                name=op.f("fk_transitions_task_id_tasks"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_transitions")),
        sa.UniqueConstraint("event_id", name=op.f("uq_transitions_event_id")),
    )
    op.create_index("ix_transitions_task_order", "transitions", ["task_id", "occurred_at", "id"])


def _audit() -> None:
    """The hash-chained audit log: each row carries its predecessor's hash."""
    op.create_table(
        "audit",
        sa.Column("id", AUTO_ID, autoincrement=True, nullable=False),
        sa.Column("at", utc(), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("action", sa.String(128), nullable=False),
        sa.Column("target", sa.String(256), nullable=False),
        sa.Column("reason", sa.String(500), nullable=False),
        sa.Column("result", sa.String(256), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit")),
        sa.UniqueConstraint("hash", name=op.f("uq_audit_hash")),
        sa.UniqueConstraint("prev_hash", name=op.f("uq_audit_prev_hash")),
    )
    op.create_index(op.f("ix_audit_at"), "audit", ["at"])


def _audit_head() -> None:
    """The chain's head, one row from the start."""
    head = op.create_table(
        "audit_head",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_head")),
    )
    # The one head row exists from the start: every append updates it (and locks it).
    op.bulk_insert(head, [{"id": 1, "hash": GENESIS, "count": 0}])


def downgrade() -> None:
    op.drop_table("audit_head")
    op.drop_index(op.f("ix_audit_at"), table_name="audit")
    op.drop_table("audit")
    op.drop_index("ix_transitions_task_order", table_name="transitions")
    op.drop_table("transitions")
    op.drop_index(op.f("ix_steps_node_id"), table_name="steps")
    op.drop_table("steps")
    for column in ("cluster_id", "created_at", "parent_task_id", "state", "target"):
        op.drop_index(op.f(f"ix_tasks_{column}"), table_name="tasks")
    op.drop_table("tasks")
