"""Where a run lives and who launched it: runs.run_dir and runs.launcher.

With them a crashed launcher is told apart from a slow one (a launcher on this host whose process is
gone has crashed, whatever its heartbeat says), and whoever marks the run crashed can write what the
run directory holds and the stores lack.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("run_dir", sa.String(1024), nullable=True))
        batch.add_column(sa.Column("launcher", sa.JSON().with_variant(JSONB(), "postgresql"), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("launcher")
        batch.drop_column("run_dir")
