"""The prompt ledger: prompt_handouts (every train group an actor handed out, by attempt) and
prompt_outcomes (each group trained or dropped, at the version its step made or would have made).

With them ``pipelinerl runs audit RUN`` audits a run's prompts from the platform database as it does
from the run directory.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _run_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["run_id"], ["runs.id"], name=f"fk_{table}_run_id_runs", ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "prompt_handouts",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("group_id", sa.String(128), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("actor_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("kept", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "group_id", "started_at", name="pk_prompt_handouts"),
        _run_fk("prompt_handouts"),
    )
    op.create_table(
        "prompt_outcomes",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("group_id", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint(
            "run_id", "group_id", "version", "outcome", "reason", name="pk_prompt_outcomes"
        ),
        _run_fk("prompt_outcomes"),
        sa.CheckConstraint(
            "(outcome = 'trained' AND reason = '') OR (outcome = 'dropped' AND reason <> '')",
            name="ck_prompt_outcomes_outcome",
        ),
    )
    op.create_index("ix_prompt_outcomes_run_id_version", "prompt_outcomes", ["run_id", "version"])


def downgrade() -> None:
    op.drop_index("ix_prompt_outcomes_run_id_version", table_name="prompt_outcomes")
    op.drop_table("prompt_outcomes")
    op.drop_table("prompt_handouts")
