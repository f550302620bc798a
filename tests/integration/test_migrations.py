"""Alembic migrations of the platform database on real SQLite and a real PostgreSQL server.

PostgreSQL: ``$PIPELINERL_TEST_POSTGRES_URL`` (default: the local server ``.ci/run`` starts); each
test gets a fresh, uniquely named database, dropped afterwards. Skipped, with the reason, when the
server cannot be reached.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from pipelinerl.platform.tracking.db import (
    ENV_DATABASE_URL,
    VERSION_TABLE,
    Base,
    PlatformDatabaseError,
    current_revision,
    downgrade,
    head_revision,
    make_engine,
    upgrade,
)
from pipelinerl.platform.tracking.store import PlatformStore

REPO = Path(__file__).parents[2]
PLATFORM_TABLES = {
    "runs",
    "policy_versions",
    "step_stats",
    "lag_histograms",
    "rollout_ledger",
    "prompt_handouts",
    "prompt_outcomes",
}
INDEXES = {
    "runs": {"ix_runs_started_at", "ix_runs_name", "ix_runs_parent_run_id"},
    "rollout_ledger": {"ix_rollout_ledger_run_id_consumed_at_version"},
    "prompt_outcomes": {"ix_prompt_outcomes_run_id_version"},
}


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'platform.db'}"
    return request.getfixturevalue("postgres_url")


def inspect_schema(url: str) -> tuple[set[str], dict[str, set[str]]]:
    """The tables of the database and the index names of each platform table."""
    engine = make_engine(url)
    try:
        inspector = inspect(engine)
        tables = set(inspector.get_table_names())
        indexes = {
            table: {index["name"] for index in inspector.get_indexes(table) if index["name"]}
            for table in tables & PLATFORM_TABLES
        }
        return tables, indexes
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(url: str) -> None:
    assert current_revision(url) is None
    upgrade(url)
    assert current_revision(url) == head_revision() == "0004"
    tables, indexes = inspect_schema(url)
    assert tables >= PLATFORM_TABLES | {"pipelinerl_alembic_version"}
    for table, expected in INDEXES.items():
        assert indexes[table] >= expected, table

    upgrade(url)  # already at head: nothing to do
    # Each migration both ways (SQLite copies the table for each).
    for before, after in (("0003", "0004"), ("0002", "0003"), ("0001", "0002")):
        downgrade(url, before)
        assert current_revision(url) == before
        upgrade(url, after)
        assert current_revision(url) == after
        downgrade(url, before)
    upgrade(url)
    assert current_revision(url) == "0004"
    downgrade(url, "base")
    assert current_revision(url) is None
    tables, _ = inspect_schema(url)
    assert not tables & PLATFORM_TABLES

    upgrade(url)
    assert current_revision(url) == "0004"
    assert inspect_schema(url)[0] >= PLATFORM_TABLES


def test_a_run_recorded_before_0003_keeps_its_row_and_gains_empty_launcher_fields(url: str) -> None:
    upgrade(url, "0002")
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql(
                "INSERT INTO runs (id, name, mode, config, status, started_at) "
                "VALUES ('old-run', 'n', 'pipeline', '{}', 'running', '2026-11-20 10:00:00')"
            )
    finally:
        engine.dispose()
    upgrade(url)
    with PlatformStore(url) as store:
        row = store.get_run("old-run").run
    assert row.status == "running" and row.run_dir is None and row.launcher is None


def test_models_and_migrations_agree(url: str) -> None:
    upgrade(url)
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            opts = {"compare_type": True, "version_table": VERSION_TABLE}
            context = MigrationContext.configure(connection, opts=opts)
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_runs_starting_together_migrate_a_fresh_database_once(url: str) -> None:
    """Three processes upgrade one fresh database at the same moment (a sweep starting its runs)."""
    start_at = time.time() + 5  # after every process has imported SQLAlchemy and Alembic
    script = (
        "import sys, time; from pipelinerl.platform.tracking.db import upgrade; "
        "time.sleep(max(0.0, float(sys.argv[2]) - time.time())); upgrade(sys.argv[1])"
    )
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, url, str(start_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], outputs
    assert current_revision(url) == head_revision()


def test_bad_revisions_and_unreachable_servers_are_one_clear_error(url: str) -> None:
    upgrade(url)
    with pytest.raises(PlatformDatabaseError, match="nosuch"):
        downgrade(url, "nosuch")
    with pytest.raises(
        PlatformDatabaseError, match=r"cannot use the platform database 'postgresql://u:\*\*\*@"
    ):
        current_revision("postgresql://u:secret@127.0.0.1:1/platform")


def test_alembic_command_line_reads_the_url_from_the_environment(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    result = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", "alembic.ini", "upgrade", "head"],
        cwd=REPO,
        env={**os.environ, ENV_DATABASE_URL: url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert current_revision(url) == head_revision()


def test_ledger_on_postgresql(postgres_url: str) -> None:
    """Two stores (two trainer processes, or one restarted) consume overlapping rollouts at once."""
    run_id = "20261122-043000-pipeline-ab12"
    with PlatformStore(postgres_url) as store:
        store.create_run(run_id, "pipelinerl", "pipeline", {"run": {}}, datetime.now(UTC))
        assert store.record_consumed(run_id, [("first", 0, 1)]) == []
        assert store.record_consumed(run_id, [("first", 0, 2), ("second", 1, 2)]) == ["first"]

    entries = [(f"{index:032x}", 0, 1) for index in range(1500)]
    duplicates: list[list[str]] = [[], []]

    def consume(slot: int) -> None:
        with PlatformStore(postgres_url) as store:
            duplicates[slot] = store.record_consumed(run_id, entries)

    run_together([lambda: consume(0), lambda: consume(1)])
    all_ids = {entry[0] for entry in entries}
    new_in_first = all_ids - set(duplicates[0])
    new_in_second = all_ids - set(duplicates[1])
    assert not new_in_first & new_in_second, "a rollout was admitted twice"
    assert new_in_first | new_in_second == all_ids

    with PlatformStore(postgres_url) as restarted:
        assert restarted.consumed_ids(run_id) == all_ids | {"first", "second"}
        assert restarted.record_consumed(run_id, [("second", 1, 3), ("third", 2, 3)]) == ["second"]


def test_prompt_ledger_on_postgresql(postgres_url: str) -> None:
    """Hand-outs and outcomes enter once each (two attempts of a group are two rows; a trained group's
    row and a drop's pass the check constraint), and a restart cuts the outcomes, not the hand-outs."""
    run_id = "20261125-010000-pipeline-cd34"
    handouts = [
        {"group_id": "a0-p0-1a", "started_at": 100.25, "actor_id": 0, "position": 0, "kept": False},
        {"group_id": "a0-p0-1a", "started_at": 200.5, "actor_id": 0, "position": 0, "kept": True},
    ]
    outcomes = [
        {"group_id": "a0-p0-1a", "version": 3, "outcome": "trained", "reason": ""},
        {"group_id": "a0-p1-1a", "version": 2, "outcome": "dropped", "reason": "zero_variance"},
    ]
    with PlatformStore(postgres_url) as store:
        store.create_run(run_id, "pipelinerl", "pipeline", {"run": {}}, datetime.now(UTC))
        assert store.record_handouts(run_id, handouts) == 2
        assert store.record_handouts(run_id, handouts) == 0
        assert store.record_outcomes(run_id, outcomes) == 2
        assert store.record_outcomes(run_id, outcomes * 2) == 0
        store.discard_after(run_id, 2)
        records = store.prompt_records(run_id)
    assert [record["started_at"] for record in records.handed_out[0]] == [100.25, 200.5]
    assert records.trained == {}
    assert records.dropped == [{"group_id": "a0-p1-1a", "reason": "zero_variance", "policy_version": 2}]


def run_together(actions: list[Callable[[], None]]) -> None:
    """Start every action at the same moment on its own thread and wait for all of them."""
    barrier = threading.Barrier(len(actions))

    def start(action: Callable[[], None]) -> None:
        barrier.wait()
        action()

    threads = [threading.Thread(target=start, args=(action,)) for action in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
