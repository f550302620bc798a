"""Alembic environment of the platform database (``pipelinerl.platform.tracking.db``).

The URL comes from Alembic's ``sqlalchemy.url`` (set in code by ``pipelinerl.platform.tracking.db``),
else from ``$PIPELINERL_DATABASE_URL`` (for ``alembic -c alembic.ini upgrade head`` from the repository root).
SQLite alters tables in batch mode (copy and rename); on PostgreSQL a transaction-scoped advisory
lock makes runs that start together on a fresh database migrate it once.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, text

from pipelinerl.platform.tracking.db import (
    ENV_DATABASE_URL,
    MIGRATION_LOCK_KEY,
    VERSION_TABLE,
    Base,
    make_engine,
    parse_url,
)

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get(ENV_DATABASE_URL)
    if not url:
        raise SystemExit(
            f"no platform database URL: set {ENV_DATABASE_URL} (e.g. sqlite:///platform.db or "
            "postgresql://user@host/db)"
        )
    return url


def run_migrations_offline() -> None:
    """Write the SQL to stdout (``alembic upgrade head --sql``) instead of running it."""
    url = parse_url(_url())
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        version_table=VERSION_TABLE,
        render_as_batch=url.get_backend_name() == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Held until the migration commits; a second process then finds the schema at head.
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        context.run_migrations()


def run_migrations_online() -> None:
    url = _url()
    engine = make_engine(url, enforce_foreign_keys=False)
    try:
        with engine.connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
