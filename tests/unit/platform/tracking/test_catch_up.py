"""Catching a crashed run's stores up when part of what it names is gone: the database is still caught
up and marked, and the note says what could not be done (no exception reaches `runs list`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from pipelinerl.platform.config import load_config
from pipelinerl.platform.tracking.catch_up import mark_crashed_and_catch_up
from pipelinerl.platform.tracking.store import PlatformStore
from pipelinerl.tasks.base import Score
from pipelinerl.workers.evaluation import round_record

STARTED = datetime(2026, 11, 25, 1, 0, tzinfo=UTC)


def crashed_run(store: PlatformStore, tmp_path: Path, run_dir: Path | None, mlflow_run_id: str) -> None:
    config = load_config(None, [f"run.home={tmp_path / 'home'}"])
    store.create_run(
        "crashed-run",
        "crashed-run",
        "pipeline",
        config.model_dump(mode="json"),
        started_at=STARTED,
        mlflow_run_id=mlflow_run_id,
        run_dir=None if run_dir is None else str(run_dir),
        launcher={"host": "elsewhere", "pid": 1},  # on another host: judged by its heartbeat alone
    )


def test_a_missing_mlflow_run_and_run_directory_are_noted_and_the_run_still_marked(tmp_path: Path) -> None:
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with PlatformStore(f"sqlite:///{tmp_path / 'platform.db'}") as store:
        crashed_run(store, tmp_path, tmp_path / "gone", mlflow_run_id="0" * 32)
        ((run, caught),) = mark_crashed_and_catch_up(store, mlflow_uri, stale_after_s=0.0)
        assert run.status == "crashed" and run.ended_at is not None
        assert caught.versions == () and caught.ledger_rows == 0 and caught.mlflow is False
        assert f"its run directory {tmp_path / 'gone'} is not reachable from here" in caught.note
        assert "MLflow run not ended" in caught.note  # that MLflow run does not exist
        # Caught up once: a second pass finds nothing running.
        assert mark_crashed_and_catch_up(store, mlflow_uri, stale_after_s=0.0) == []


def test_a_run_recorded_before_its_directory_was_kept_is_marked_and_said_so(tmp_path: Path) -> None:
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with PlatformStore(f"sqlite:///{tmp_path / 'platform.db'}") as store:
        crashed_run(store, tmp_path, None, mlflow_run_id="1" * 32)
        ((run, caught),) = mark_crashed_and_catch_up(store, mlflow_uri, stale_after_s=0.0)
        assert run.status == "crashed"
        assert "the database holds no run directory for it (recorded before revision 0003)" in caught.note
        assert caught.describe().startswith("crashed-run: nothing to catch up (")


def test_a_store_refusing_the_records_is_noted_and_the_database_still_gets_its_part(tmp_path: Path) -> None:
    """The run directory is there, but its MLflow run is not (deleted, or another server's id): MLflow
    refuses the points, the note says so, and the database is marked and caught up all the same."""
    run_dir = tmp_path / "runs" / "crashed-run"
    run_dir.mkdir(parents=True)
    scores = [("p0", Score(1.0, "correct"), 12, False), ("p1", Score(0.0, "wrong"), 20, False)]
    (run_dir / "eval.jsonl").write_text(json.dumps(round_record("held_out", 2, scores, 1)) + "\n")
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with PlatformStore(f"sqlite:///{tmp_path / 'platform.db'}") as store:
        crashed_run(store, tmp_path, run_dir, mlflow_run_id="2" * 32)
        ((run, caught),) = mark_crashed_and_catch_up(store, mlflow_uri, stale_after_s=0.0)
        assert run.status == "crashed"
        assert "a store refused some records (see the log)" in caught.note
        assert caught.mlflow is False
        assert mark_crashed_and_catch_up(store, mlflow_uri, stale_after_s=0.0) == []
