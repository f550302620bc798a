"""Run heartbeats: runs.heartbeat_at, and the status 'crashed' for runs whose heartbeat stopped.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)
STATUSES = "status IN ('running', 'finished', 'failed', 'killed', 'crashed')"
STATUSES_BEFORE = "status IN ('running', 'finished', 'failed', 'killed')"


def upgrade() -> None:
    # batch mode: SQLite changes a constraint by copying the table.
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("heartbeat_at", TIMESTAMP, nullable=True))
        batch.drop_constraint("ck_runs_status", type_="check")
        batch.create_check_constraint("ck_runs_status", STATUSES)


def downgrade() -> None:
    op.execute("UPDATE runs SET status = 'failed' WHERE status = 'crashed'")
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("ck_runs_status", type_="check")
        batch.create_check_constraint("ck_runs_status", STATUSES_BEFORE)
        batch.drop_column("heartbeat_at")
