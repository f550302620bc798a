"""The platform database: the platform's own tables, the engine that reaches them, and their migrations.

MLflow keeps a run's metrics for plotting and comparison; this database keeps what the platform
itself must know and query: which runs exist and how they ended, each policy version, per-step
statistics, lag histograms, the rollout ledger that makes every rollout trained at most once
(a restarted stage neither loses nor duplicates data), and the prompt ledger beside it: every train
prompt handed out and what became of it, which ``pipelinerl runs audit RUN`` checks.

Backends: SQLite (the embedded default, one file in the platform home) and PostgreSQL (at scale,
``postgresql://user@host/db`` through psycopg2). The schema is owned by Alembic (``migrations/`` at
the repository root); :func:`upgrade`, :func:`downgrade` and :func:`current_revision` drive it from
Python, and ``PlatformStore`` upgrades to head when it opens a database.

Timestamps are stored in UTC and always come back timezone-aware (SQLite keeps no zone, so naive
values read from it are UTC by construction); a naive datetime handed in is taken as UTC.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    create_engine,
    event,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, InterfaceError, NoSuchModuleError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

if TYPE_CHECKING:
    from pipelinerl.platform.config import PipelineConfig

ENV_DATABASE_URL = "PIPELINERL_DATABASE_URL"
DEFAULT_DATABASE_FILE = "platform.db"
MIGRATIONS_DIR = Path(__file__).resolve().parents[3] / "migrations"
# Alembic's version table under its own name, so the platform tables can share a database with
# MLflow's or Prefect's (each keeps its own ``alembic_version``).
VERSION_TABLE = "pipelinerl_alembic_version"
# crashed: the run's launcher stopped sending heartbeats while the run was running (a kill -9, a lost
# node); set by whoever notices (``PlatformStore.mark_silent_runs_crashed``).
RUN_STATUSES = ("running", "finished", "failed", "killed", "crashed")
SUPPORTED_BACKENDS = ("sqlite", "postgresql")
# Held (pg_advisory_xact_lock) while a migration runs, so that runs starting together on a fresh
# PostgreSQL database migrate it once instead of racing; any constant unique to this schema works.
MIGRATION_LOCK_KEY = 0x5049_5045_4C52  # "PIPELR"
# Alembic's ``context`` and ``op`` are module-level proxies: two migrations in one process at once would
# swap each other's, so one process migrates one database at a time.
_ALEMBIC_LOCK = threading.Lock()
# A blackholed PostgreSQL host would otherwise hang a run's start (and the CLI) for minutes.
POSTGRES_CONNECT_TIMEOUT_S = 10
# Seconds a SQLite writer waits for another process's write lock before failing.
SQLITE_BUSY_TIMEOUT_S = 30


class PlatformDatabaseError(RuntimeError):
    """The platform database cannot be used (bad URL, server unreachable, unknown revision).

    The message is meant for the user as is: it names the URL (password hidden) and the cause.
    """


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware timestamp, stored in UTC on every backend."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        # SQLite has no zone: store the naive UTC wall time, read back as UTC below.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# JSON documents; JSONB on PostgreSQL so they can be indexed and queried there.
JSONDocument = JSON().with_variant(JSONB(), "postgresql")

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base of the platform tables; its metadata is what Alembic compares against."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Run(Base):
    """One experiment run: what was asked (mode, resolved config), how it went, where else it lives."""

    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint(
            "status IN ('running', 'finished', 'failed', 'killed', 'crashed')",
            name="ck_runs_status",
        ),
        Index("ix_runs_started_at", "started_at"),
        Index("ix_runs_name", "name"),
        Index("ix_runs_parent_run_id", "parent_run_id"),
    )

    id: Mapped[str] = mapped_column(
        String(128), primary_key=True, doc="run id, e.g. 20261122-043000-pipeline-ab12"
    )
    name: Mapped[str] = mapped_column(String(200), doc="experiment name (the MLflow experiment)")
    mode: Mapped[str] = mapped_column(String(32), doc="pipeline, conventional or async")
    config: Mapped[dict[str, Any]] = mapped_column(JSONDocument, doc="the resolved configuration")
    status: Mapped[str] = mapped_column(String(16), doc="running, finished, failed, killed or crashed")
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime | None] = mapped_column(
        UTCDateTime(), doc="the launcher's latest sign of life while the run runs (every few seconds)"
    )
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    prefect_flow_run_id: Mapped[str | None] = mapped_column(String(64))
    parent_run_id: Mapped[str | None] = mapped_column(
        ForeignKey("runs.id", ondelete="SET NULL"), doc="the comparison or sweep this run belongs to"
    )
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSONDocument, doc="summary.json of the run")
    run_dir: Mapped[str | None] = mapped_column(
        String(1024), doc="the run directory, absolute, as its launcher saw it (shared storage for pools)"
    )
    launcher: Mapped[dict[str, Any] | None] = mapped_column(
        JSONDocument, doc="the launcher process: host, boot id, pid and start time (tracking/liveness.py)"
    )


class PolicyVersion(Base):
    """One policy version of a run (+1 per optimizer step): how much it was trained and how it shipped."""

    __tablename__ = "policy_versions"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    samples_trained: Mapped[int] = mapped_column(BigInteger, doc="sequences trained up to this version")
    tokens_trained: Mapped[int] = mapped_column(BigInteger, doc="tokens trained up to this version")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    checkpoint_path: Mapped[str | None] = mapped_column(String(1024))
    broadcast_ms: Mapped[float | None] = mapped_column(Float, doc="trainer: publishing the weights")
    pause_ms: Mapped[float | None] = mapped_column(Float, doc="actors: generation paused for the update")


class StepStats(Base):
    """Statistics of one optimizer step, keyed by the policy version it produced."""

    __tablename__ = "step_stats"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    loss: Mapped[float | None] = mapped_column(Float)
    reward_mean: Mapped[float | None] = mapped_column(Float)
    ess: Mapped[float | None] = mapped_column(Float, doc="effective sample size of the step's tokens")
    lag_mean: Mapped[float | None] = mapped_column(Float)
    lag_p50: Mapped[float | None] = mapped_column(Float)
    lag_p90: Mapped[float | None] = mapped_column(Float)
    lag_max: Mapped[int | None] = mapped_column(Integer)
    tokens: Mapped[int | None] = mapped_column(BigInteger)
    samples: Mapped[int | None] = mapped_column(Integer)
    step_s: Mapped[float | None] = mapped_column(Float, doc="trainer seconds spent on the step")
    wait_s: Mapped[float | None] = mapped_column(Float, doc="trainer seconds waiting for its batch")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class LagHistogram(Base):
    """Token lag histogram of one optimizer step: ``count`` tokens had lag ``lag``."""

    __tablename__ = "lag_histograms"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    lag: Mapped[int] = mapped_column(Integer, primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger)


class RolloutLedger(Base):
    """Every rollout the trainer consumed; the key (run_id, rollout_id) admits each rollout once."""

    __tablename__ = "rollout_ledger"
    __table_args__ = (Index("ix_rollout_ledger_run_id_consumed_at_version", "run_id", "consumed_at_version"),)

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    rollout_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    produced_by_version: Mapped[int] = mapped_column(
        Integer, doc="oldest policy version that wrote any of its tokens"
    )
    consumed_at_version: Mapped[int] = mapped_column(Integer, doc="trainer version that trained it")
    consumed_at: Mapped[datetime] = mapped_column(UTCDateTime())


class PromptHandout(Base):
    """One train group an actor handed out (``prompts/actor<k>.jsonl``), by the attempt that did.

    Never deleted, not even by a restart: a prompt handed out is a fact of the run's history. A group an
    actor kept through a restart of the trainer role is recorded again under the new attempt (``kept``),
    hence ``started_at`` in the key.
    """

    __tablename__ = "prompt_handouts"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    group_id: Mapped[str] = mapped_column(String(128), primary_key=True, doc="a<actor>-p<position>-<nonce>")
    started_at: Mapped[float] = mapped_column(
        Float, primary_key=True, doc="Unix time the attempt that handed it out started (which attempt)"
    )
    actor_id: Mapped[int] = mapped_column(Integer)
    position: Mapped[int] = mapped_column(Integer, doc="the prompt's position in the actor's stream")
    kept: Mapped[bool] = mapped_column(Boolean, doc="kept in flight through a restart of the trainer role")


class PromptOutcome(Base):
    """What became of a train group: trained by a step, or dropped (by the preprocessor or a trainer
    rank) with its reason. ``version`` is the policy version the step made, or would have made: a
    restart deletes the outcomes of the versions it discards, as it does their rollouts' ledger rows.

    ``reason`` is '' for a trained group (it is part of the key, which admits no NULL): the key makes
    every outcome one row however often its records are read, so a retried or caught-up write adds none.
    """

    __tablename__ = "prompt_outcomes"
    __table_args__ = (
        CheckConstraint(
            "(outcome = 'trained' AND reason = '') OR (outcome = 'dropped' AND reason <> '')",
            name="ck_prompt_outcomes_outcome",
        ),
        Index("ix_prompt_outcomes_run_id_version", "run_id", "version"),
    )

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    group_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    outcome: Mapped[str] = mapped_column(String(16), primary_key=True, doc="trained or dropped")
    reason: Mapped[str] = mapped_column(
        String(64), primary_key=True, doc="why it was dropped (zero_variance, stale, ...); '' if trained"
    )


def utcnow() -> datetime:
    return datetime.now(UTC)


def database_url(config: PipelineConfig) -> str:
    """The platform database of a run: ``tracking.database_url``, else ``$PIPELINERL_DATABASE_URL``,
    else a SQLite file in the platform home (created if missing)."""
    if config.tracking.database_url:
        return config.tracking.database_url
    from_env = os.environ.get(ENV_DATABASE_URL)
    if from_env:
        return from_env
    home = config.run.home.expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / DEFAULT_DATABASE_FILE}"


def parse_url(url: str) -> URL:
    """Validate a platform database URL: SQLite or PostgreSQL (``postgres://`` is read as ``postgresql://``)."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url.removeprefix("postgres://")
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise PlatformDatabaseError(
            f"{url!r} is not a database URL; expected sqlite:///path/to/file.db or postgresql://user@host/db"
        ) from None
    if parsed.get_backend_name() not in SUPPORTED_BACKENDS:
        raise PlatformDatabaseError(
            f"unsupported database backend {parsed.get_backend_name()!r} in {display_url(parsed)!r}; "
            "expected sqlite:///path/to/file.db or postgresql://user@host/db"
        )
    return parsed


def display_url(url: str | URL) -> str:
    """The URL with its password hidden, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return str(url)


def _enable_sqlite_foreign_keys(dbapi_connection: Any, connection_record: Any) -> None:
    # SQLite ignores foreign keys (and their ON DELETE) unless every connection asks for them.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def make_engine(url: str, *, enforce_foreign_keys: bool = True) -> Engine:
    """An engine on the platform database; foreign keys are enforced on SQLite too.

    Migrations open theirs with ``enforce_foreign_keys=False``: SQLite's batch mode rebuilds a table
    by copy, drop and rename, which would fire ``ON DELETE CASCADE`` on the rows that refer to it.
    """
    parsed = parse_url(url)
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql":
        connect_args["connect_timeout"] = POSTGRES_CONNECT_TIMEOUT_S
    else:
        connect_args["timeout"] = SQLITE_BUSY_TIMEOUT_S
    try:
        engine = create_engine(
            parsed,
            connect_args=connect_args,
            # A config holding paths (model_dump() instead of model_dump(mode="json")) still serializes.
            json_serializer=lambda value: json.dumps(value, default=str),
            pool_pre_ping=True,
        )
    except (NoSuchModuleError, ImportError) as error:
        raise PlatformDatabaseError(
            f"no driver for {display_url(parsed)!r}: {error} (PostgreSQL needs psycopg2-binary)"
        ) from None
    if parsed.get_backend_name() == "sqlite" and enforce_foreign_keys:
        event.listen(engine, "connect", _enable_sqlite_foreign_keys)
    return engine


@contextlib.contextmanager
def translate_errors(url: str | URL) -> Iterator[None]:
    """Turn connection and migration failures into one :class:`PlatformDatabaseError` line."""
    try:
        yield
    except (OperationalError, InterfaceError) as error:
        cause = str(error.orig).strip().splitlines()[0] if error.orig is not None else str(error)
        raise PlatformDatabaseError(
            f"cannot use the platform database {display_url(url)!r}: {cause}"
        ) from None
    except CommandError as error:
        raise PlatformDatabaseError(f"platform database {display_url(url)!r}: {error}") from None


def alembic_config(url: str) -> Config:
    """Alembic's configuration for ``url``, built in code (no ``alembic.ini`` needed)."""
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise PlatformDatabaseError(
            f"the migrations directory {str(MIGRATIONS_DIR)!r} is missing; install pipelinerl from its "
            "repository (pip install -e .) so that migrations/ sits next to the package"
        )
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolates '%': a URL-encoded password (p%40ss) must reach Alembic as p%%40ss.
    config.set_main_option(
        "sqlalchemy.url", parse_url(url).render_as_string(hide_password=False).replace("%", "%%")
    )
    return config


@contextlib.contextmanager
def _migration_lock(url: str) -> Iterator[None]:
    """Serialize migrations of one SQLite file across processes (PostgreSQL locks inside env.py)."""
    parsed = parse_url(url)
    database = parsed.database
    if (
        parsed.get_backend_name() != "sqlite"
        or not database
        or database == ":memory:"
        or database.startswith("file:")
    ):
        yield
        return
    lock_path = Path(f"{database}.migrate-lock")
    try:
        lock_file = lock_path.open("a")
    except OSError as error:
        raise PlatformDatabaseError(
            f"cannot use the platform database {display_url(parsed)!r}: {error}"
        ) from None
    with lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision`` (creating the tables on a fresh one)."""
    config = alembic_config(url)
    with translate_errors(url), _ALEMBIC_LOCK, _migration_lock(url):
        command.upgrade(config, revision)


def downgrade(url: str, revision: str) -> None:
    """Migrate the database at ``url`` down to ``revision`` (``base`` drops every platform table)."""
    config = alembic_config(url)
    with translate_errors(url), _ALEMBIC_LOCK, _migration_lock(url):
        command.downgrade(config, revision)


def current_revision(url: str) -> str | None:
    """The revision the database at ``url`` is at; None for a database never migrated."""
    engine = make_engine(url)
    try:
        with translate_errors(url), engine.connect() as connection:
            return MigrationContext.configure(
                connection, opts={"version_table": VERSION_TABLE}
            ).get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str:
    """The newest revision the migrations directory holds."""
    config = alembic_config("sqlite://")
    head = ScriptDirectory.from_config(config).get_current_head()
    if head is None:
        raise PlatformDatabaseError(f"no migration in {str(MIGRATIONS_DIR)!r}")
    return head
