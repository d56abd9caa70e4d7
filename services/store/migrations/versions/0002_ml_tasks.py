"""ML tasks: the tasks, their attempts, and the log of their events.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

AUTO_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TASK_INDEXES = ("cluster_id", "created_at", "model", "node_id", "state", "task_type")


def utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "ml_tasks",
        sa.Column("task_id", sa.Uuid(), nullable=False),
        sa.Column("cluster_id", sa.String(128), nullable=False),
        sa.Column("task_type", sa.String(128), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=True),
        sa.Column("critical", sa.Boolean(), nullable=False),
        sa.Column("submitted_by", sa.String(128), nullable=True),
        sa.Column("deadline", utc(), nullable=True),
        sa.Column("input", sa.JSON(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=True),
        sa.Column("model", sa.String(128), nullable=True),
        sa.Column("version", sa.String(32), nullable=True),
        sa.Column("family", sa.String(128), nullable=True),
        sa.Column("cause", sa.String(32), nullable=True),
        sa.Column("reason", sa.String(256), nullable=False),
        sa.Column("prediction", sa.BigInteger(), nullable=True),
        sa.Column("confidence", sa.Float(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("created_at", utc(), nullable=False),
        sa.Column("updated_at", utc(), nullable=False),
        sa.Column("finished_at", utc(), nullable=True),
        sa.PrimaryKeyConstraint("task_id", name=op.f("pk_ml_tasks")),
    )
    for column in TASK_INDEXES:
        op.create_index(op.f(f"ix_ml_tasks_{column}"), "ml_tasks", [column])

    op.create_table(
        "ml_attempts",
        sa.Column("task_id", sa.Uuid(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=True),
        sa.Column("model", sa.String(128), nullable=True),
        sa.Column("version", sa.String(32), nullable=True),
        sa.Column("family", sa.String(128), nullable=True),
        sa.Column("command_id", sa.Uuid(), nullable=True),
        sa.Column("probe", sa.Boolean(), nullable=False),
        sa.Column("decision_reason", sa.String(256), nullable=False),
        sa.Column("candidates", sa.JSON(), nullable=False),
        sa.Column("decided_at", utc(), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("cause", sa.String(32), nullable=True),
        sa.Column("attributed_to", sa.String(16), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("node_latency_ms", sa.Float(), nullable=True),
        sa.Column("prediction", sa.BigInteger(), nullable=True),
        sa.Column("confidence", sa.Float(), nullable=True),
        sa.Column("ended_at", utc(), nullable=True),
        sa.Column("reason", sa.String(256), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["ml_tasks.task_id"],
                                name=op.f("fk_ml_attempts_task_id_ml_tasks"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("task_id", "attempt", name=op.f("pk_ml_attempts")),
    )
    op.create_index(op.f("ix_ml_attempts_node_id"), "ml_attempts", ["node_id"])

    op.create_table(
        "ml_events",
        sa.Column("id", AUTO_ID, autoincrement=True, nullable=False),
        sa.Column("event_id", sa.Uuid(), nullable=False),
        sa.Column("task_id", sa.Uuid(), nullable=False),
        sa.Column("event_type", sa.String(32), nullable=False),
        sa.Column("occurred_at", utc(), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["ml_tasks.task_id"],
                                name=op.f("fk_ml_events_task_id_ml_tasks"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ml_events")),
        sa.UniqueConstraint("event_id", name=op.f("uq_ml_events_event_id")),
    )
    op.create_index("ix_ml_events_task_order", "ml_events", ["task_id", "occurred_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_ml_events_task_order", table_name="ml_events")
    op.drop_table("ml_events")
    op.drop_index(op.f("ix_ml_attempts_node_id"), table_name="ml_attempts")
    op.drop_table("ml_attempts")
    for column in TASK_INDEXES:
        op.drop_index(op.f(f"ix_ml_tasks_{column}"), table_name="ml_tasks")
    op.drop_table("ml_tasks")
