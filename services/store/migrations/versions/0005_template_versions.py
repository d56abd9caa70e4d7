"""Template versions: every version of every task template, and each template's active
version and pin.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    utc = sa.DateTime(timezone=True)
    auto_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "template_versions",
        sa.Column("id", auto_id, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("need", sa.String(32), nullable=False),
        sa.Column("yaml", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("origin", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("reason", sa.String(500), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("created_at", utc, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_template_versions")),
    )
    # Unique: two saves computing the same next version cannot both commit.
    op.create_index("ix_template_versions_name_version", "template_versions",
                    ["name", "version"], unique=True)
    op.create_table(
        "template_state",
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("active_version", sa.Integer(), nullable=False),
        sa.Column("pinned", sa.Boolean(), nullable=False),
        sa.Column("pinned_by", sa.String(128), nullable=True),
        sa.Column("pin_reason", sa.String(500), nullable=True),
        sa.Column("pinned_at", utc, nullable=True),
        sa.Column("updated_at", utc, nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_template_state")),
    )


def downgrade() -> None:
    op.drop_table("template_state")
    op.drop_index("ix_template_versions_name_version", table_name="template_versions")
    op.drop_table("template_versions")
