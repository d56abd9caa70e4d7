"""Capacity plans: every pool's published plan for procurement (CapacityPlan events).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    utc = sa.DateTime(timezone=True)
    op.create_table(
        "capacity_plans",
        sa.Column("event_id", sa.Uuid(), nullable=False),
        sa.Column("cluster_id", sa.String(128), nullable=False),
        sa.Column("pool", sa.String(128), nullable=False),
        sa.Column("generated_at", utc, nullable=False),
        sa.Column("horizon_days", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("leaves_range_at", utc, nullable=True),
        sa.Column("nodes_to_add", sa.Integer(), nullable=False),
        sa.Column("gpus_to_add", sa.Integer(), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_capacity_plans")),
    )
    op.create_index("ix_capacity_plans_pool_generated", "capacity_plans",
                    ["cluster_id", "pool", "generated_at"])


def downgrade() -> None:
    op.drop_index("ix_capacity_plans_pool_generated", table_name="capacity_plans")
    op.drop_table("capacity_plans")
