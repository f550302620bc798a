"""The platform tables: runs, policy versions, step statistics, lag histograms, the rollout ledger.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)


def _run_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["run_id"], ["runs.id"], name=f"fk_{table}_run_id_runs", ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("mode", sa.String(32), nullable=False),
        sa.Column("config", JSON_DOCUMENT, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("started_at", TIMESTAMP, nullable=False),
        sa.Column("ended_at", TIMESTAMP, nullable=True),
        sa.Column("mlflow_run_id", sa.String(64), nullable=True),
        sa.Column("prefect_flow_run_id", sa.String(64), nullable=True),
        sa.Column("parent_run_id", sa.String(128), nullable=True),
        sa.Column("summary", JSON_DOCUMENT, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        sa.ForeignKeyConstraint(
            ["parent_run_id"], ["runs.id"], name="fk_runs_parent_run_id_runs", ondelete="SET NULL"
        ),
        sa.CheckConstraint("status IN ('running', 'finished', 'failed', 'killed')", name="ck_runs_status"),
    )
    op.create_index("ix_runs_started_at", "runs", ["started_at"])
    op.create_index("ix_runs_name", "runs", ["name"])
    op.create_index("ix_runs_parent_run_id", "runs", ["parent_run_id"])

    op.create_table(
        "policy_versions",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("samples_trained", sa.BigInteger(), nullable=False),
        sa.Column("tokens_trained", sa.BigInteger(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("checkpoint_path", sa.String(1024), nullable=True),
        sa.Column("broadcast_ms", sa.Float(), nullable=True),
        sa.Column("pause_ms", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("run_id", "version", name="pk_policy_versions"),
        _run_fk("policy_versions"),
    )

    op.create_table(
        "step_stats",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("reward_mean", sa.Float(), nullable=True),
        sa.Column("ess", sa.Float(), nullable=True),
        sa.Column("lag_mean", sa.Float(), nullable=True),
        sa.Column("lag_p50", sa.Float(), nullable=True),
        sa.Column("lag_p90", sa.Float(), nullable=True),
        sa.Column("lag_max", sa.Integer(), nullable=True),
        sa.Column("tokens", sa.BigInteger(), nullable=True),
        sa.Column("samples", sa.Integer(), nullable=True),
        sa.Column("step_s", sa.Float(), nullable=True),
        sa.Column("wait_s", sa.Float(), nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("run_id", "version", name="pk_step_stats"),
        _run_fk("step_stats"),
    )

    op.create_table(
        "lag_histograms",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("lag", sa.Integer(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "version", "lag", name="pk_lag_histograms"),
        _run_fk("lag_histograms"),
    )

    op.create_table(
        "rollout_ledger",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("rollout_id", sa.String(128), nullable=False),
        sa.Column("produced_by_version", sa.Integer(), nullable=False),
        sa.Column("consumed_at_version", sa.Integer(), nullable=False),
        sa.Column("consumed_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("run_id", "rollout_id", name="pk_rollout_ledger"),
        _run_fk("rollout_ledger"),
    )
    op.create_index(
        "ix_rollout_ledger_run_id_consumed_at_version", "rollout_ledger", ["run_id", "consumed_at_version"]
    )


def downgrade() -> None:
    op.drop_index("ix_rollout_ledger_run_id_consumed_at_version", table_name="rollout_ledger")
    op.drop_table("rollout_ledger")
    op.drop_table("lag_histograms")
    op.drop_table("step_stats")
    op.drop_table("policy_versions")
    op.drop_index("ix_runs_parent_run_id", table_name="runs")
    op.drop_index("ix_runs_name", table_name="runs")
    op.drop_index("ix_runs_started_at", table_name="runs")
    op.drop_table("runs")
