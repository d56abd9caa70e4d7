"""The audit chain's head keyed: a MAC column on `audit_head`.

A head written before has none, and the migration cannot make one (it does not hold the audit
key): such a head fails verification until an admin has checked the log and keys it
(`POST /api/audit/head/key`, `warden audit key-head`). A new log's head needs none.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Batch, as the downgrade: an older SQLite cannot drop a column in place (alembic copies
    # the table there; PostgreSQL alters it).
    with op.batch_alter_table("audit_head") as table:
        table.add_column(sa.Column("mac", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("audit_head") as table:
        table.drop_column("mac")
