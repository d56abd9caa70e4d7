"""Alerts: the state of each alert (firing, resolved), its acknowledgement and delivery.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("cluster_id", sa.String(128), nullable=False),
        sa.Column("dedup_key", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(128), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("source", sa.String(128), nullable=False),
        sa.Column("message", sa.String(256), nullable=False),
        sa.Column("resolution", sa.String(256), nullable=True),
        sa.Column("starts_at", utc(), nullable=False),
        sa.Column("updated_at", utc(), nullable=False),
        sa.Column("resolved_at", utc(), nullable=True),
        sa.Column("last_event_id", sa.Uuid(), nullable=False),
        sa.Column("occurrences", sa.Integer(), nullable=False),
        sa.Column("acknowledged_by", sa.String(128), nullable=True),
        sa.Column("acknowledged_at", utc(), nullable=True),
        sa.Column("ack_reason", sa.String(256), nullable=True),
        sa.Column("delivered_at", utc(), nullable=True),
        sa.Column("last_change", sa.String(16), nullable=False),
        sa.Column("webhook_pending", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("cluster_id", "dedup_key", name=op.f("pk_alerts")),
    )
    op.create_index("ix_alerts_status_updated", "alerts", ["status", "updated_at"])


def downgrade() -> None:
    op.drop_index("ix_alerts_status_updated", table_name="alerts")
    op.drop_table("alerts")
