"""PlatformStore on a real SQLite file: runs, steps, policy versions, the rollout ledger, run lookup."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import select

from pipelinerl.platform.config import load_config
from pipelinerl.platform.tracking.db import (
    ENV_DATABASE_URL,
    PlatformDatabaseError,
    RolloutLedger,
    database_url,
    make_engine,
    parse_url,
)
from pipelinerl.platform.tracking.store import PlatformStore

STARTED = datetime(2026, 11, 22, 4, 30, tzinfo=UTC)


def create(store: PlatformStore, run_id: str = "20261122-043000-pipeline-ab12", **fields) -> str:
    fields = {"name": "pipelinerl", "mode": "pipeline", "config": {"run": {"mode": "pipeline"}}} | fields
    store.create_run(run_id, started_at=fields.pop("started_at", STARTED), **fields)
    return run_id


def trainer_record(version: int, reward: float) -> dict:
    """The keys of the trainer's per-step record that the table keeps, plus some it does not."""
    return {
        "policy_version": version,
        "rl/loss": -0.5,
        "rl/reward_mean": reward,
        "rl/ess": 0.97,
        "rl/clipped_fraction": 0.0,
        "lag/mean": 0.4,
        "lag/p50": 0.0,
        "lag/p90": 1.0,
        "lag/max": 2,
        "lag/by_position": [0.1, 0.5],
        "trainer/tokens": 900,
        "trainer/samples": 32,
        "trainer/step_s": 1.5,
        "trainer/wait_s": 0.25,
    }


def test_create_and_finish_a_run(store: PlatformStore) -> None:
    run_id = create(store, mlflow_run_id=None, prefect_flow_run_id="flow-1")
    (listed,) = store.list_runs()
    assert (listed.id, listed.status, listed.steps, listed.ended_at) == (run_id, "running", 0, None)
    assert listed.started_at == STARTED and listed.started_at.tzinfo is not None

    store.set_mlflow_run_id(run_id, "mlflow-abc")
    ended = STARTED + timedelta(minutes=3, seconds=7)
    store.finish_run(run_id, "finished", ended, {"eval_success_end": 0.4, "steps": 3})

    detail = store.get_run(run_id)
    assert detail.run.status == "finished" and detail.run.ended_at == ended
    assert detail.run.duration_s == 187.0
    assert detail.run.mlflow_run_id == "mlflow-abc" and detail.run.prefect_flow_run_id == "flow-1"
    assert detail.run.summary == {"eval_success_end": 0.4, "steps": 3}
    assert detail.config == {"run": {"mode": "pipeline"}}


def test_timestamps_in_any_zone_come_back_in_utc(store: PlatformStore) -> None:
    local = datetime(2026, 11, 22, 6, 30, tzinfo=timezone(timedelta(hours=2)))
    run_id = create(store, started_at=local)
    assert store.get_run(run_id).run.started_at == STARTED
    assert store.get_run(run_id).run.started_at.utcoffset() == timedelta(0)


def test_run_errors_name_the_run(store: PlatformStore) -> None:
    run_id = create(store)
    with pytest.raises(ValueError, match=f"{run_id!r} already exists"):
        create(store, run_id)
    with pytest.raises(LookupError, match="parent run 'nosuch'"):
        create(store, "child", parent_run_id="nosuch")
    with pytest.raises(ValueError, match="'done' is not a final status; valid: finished, failed, killed"):
        store.finish_run(run_id, "done", STARTED)
    with pytest.raises(LookupError, match="no run 'nosuch'"):
        store.finish_run("nosuch", "failed", STARTED)
    with pytest.raises(LookupError, match="no run 'nosuch'"):
        store.record_step("nosuch", 1, {}, {})


def test_parent_run_links_a_comparison(store: PlatformStore) -> None:
    parent = create(store, "compare-1", mode="compare")
    create(store, "compare-1-pipeline", parent_run_id=parent)
    assert store.get_run("compare-1-pipeline").run.parent_run_id == parent


def test_recording_a_step_again_replaces_it(store: PlatformStore) -> None:
    run_id = create(store)
    store.record_step(run_id, 1, trainer_record(1, reward=0.1), {0: 800, 1: 90, 2: 10})
    store.record_step(run_id, 2, trainer_record(2, reward=0.2), [700, 0, 200])
    store.record_step(run_id, 1, trainer_record(1, reward=0.15), {0: 900})

    detail = store.get_run(run_id)
    assert [(s.version, s.reward_mean) for s in detail.steps] == [(1, 0.15), (2, 0.2)]
    first = detail.steps[0]
    assert (first.loss, first.ess, first.lag_mean, first.lag_p50, first.lag_p90, first.lag_max) == (
        -0.5, 0.97, 0.4, 0.0, 1.0, 2,
    )  # fmt: skip
    assert (first.tokens, first.samples, first.step_s, first.wait_s) == (900, 32, 1.5, 0.25)
    assert detail.lag_histograms == {1: {0: 900}, 2: {0: 700, 2: 200}}
    assert store.list_runs()[0].steps == 2


def test_steps_accept_column_names_and_missing_values(store: PlatformStore) -> None:
    run_id = create(store)
    store.record_step(run_id, 1, {"reward_mean": 0.5, "lag_max": 3.0}, {})
    (step,) = store.get_run(run_id).steps
    assert step.reward_mean == 0.5 and step.lag_max == 3 and isinstance(step.lag_max, int)
    assert step.loss is None and step.tokens is None


def test_policy_version_upsert_keeps_fields_given_as_none(store: PlatformStore) -> None:
    run_id = create(store)
    store.record_policy_version(run_id, 1, 32, 900, STARTED, broadcast_ms=12.5)
    store.record_policy_version(
        run_id, 1, 32, 900, STARTED, checkpoint_path="runs/x/checkpoints/v1", pause_ms=3.0
    )
    store.record_policy_version(run_id, 2, 64, 1800, STARTED + timedelta(seconds=2))

    first, second = store.get_run(run_id).policy_versions
    assert (first.version, first.samples_trained, first.tokens_trained) == (1, 32, 900)
    assert (first.checkpoint_path, first.broadcast_ms, first.pause_ms) == ("runs/x/checkpoints/v1", 12.5, 3.0)
    assert (second.version, second.samples_trained, second.broadcast_ms) == (2, 64, None)


def test_ledger_admits_each_rollout_once_across_restarts(url: str, store: PlatformStore) -> None:
    run_id = create(store)
    other_run = create(store, "other-run")
    assert store.record_consumed(run_id, [("r1", 0, 1), ("r2", 0, 1)]) == []
    assert store.record_consumed(run_id, [("r3", 1, 2), ("r1", 0, 2), ("r2", 0, 2)]) == ["r1", "r2"]

    with PlatformStore(url) as restarted:  # a restarted trainer opens the same database
        assert restarted.consumed_ids(run_id) == {"r1", "r2", "r3"}
        assert restarted.record_consumed(run_id, [("r2", 0, 3), ("r4", 2, 3), ("r4", 2, 3)]) == ["r2"]

    assert store.consumed_ids(run_id) == {"r1", "r2", "r3", "r4"}
    assert store.get_run(run_id).run.id == run_id
    # The ledger is per run: the same id in another run is new.
    assert store.record_consumed(other_run, [("r1", 0, 1)]) == []
    assert store.record_consumed(run_id, []) == []


def test_ledger_keeps_the_first_consumption(url: str, store: PlatformStore) -> None:
    run_id = create(store)
    store.record_consumed(run_id, [("r1", 3, 5)])
    store.record_consumed(run_id, [("r1", 7, 9)])
    engine = make_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(
            select(RolloutLedger.produced_by_version, RolloutLedger.consumed_at_version)
        )
        assert [tuple(row) for row in rows] == [(3, 5)]
    engine.dispose()


def test_large_ledger_batches_span_several_statements(store: PlatformStore) -> None:
    run_id = create(store)
    entries = [(f"{index:032x}", 0, 1) for index in range(2500)]
    assert store.record_consumed(run_id, entries[:1200]) == []
    assert store.record_consumed(run_id, entries) == [entry[0] for entry in entries[:1200]]
    assert len(store.consumed_ids(run_id)) == 2500


def test_runs_are_found_by_unique_prefix(store: PlatformStore) -> None:
    create(store, "20261122-043000-pipeline-ab12")
    create(store, "20261122-043500-conventional-cd34", started_at=STARTED + timedelta(minutes=5))
    create(store, "run-1")
    create(store, "run-10")

    assert store.get_run("20261122-0435").run.id == "20261122-043500-conventional-cd34"
    assert store.get_run("run-1").run.id == "run-1"  # an exact id wins over the longer ones it prefixes
    with pytest.raises(LookupError, match="no run 'nosuch' in the platform database"):
        store.get_run("nosuch")
    with pytest.raises(LookupError) as ambiguous:
        store.get_run("20261122-04")
    message = str(ambiguous.value)
    assert "'20261122-04' is ambiguous" in message
    assert "20261122-043000-pipeline-ab12" in message and "20261122-043500-conventional-cd34" in message
    with pytest.raises(LookupError, match="no run '20261122_'"):
        store.get_run("20261122_")  # '_' is not a LIKE wildcard here


def test_list_runs_newest_first_with_limit(store: PlatformStore) -> None:
    for index in range(5):
        create(store, f"run-{index}", started_at=STARTED + timedelta(minutes=index))
    assert [run.id for run in store.list_runs(limit=3)] == ["run-4", "run-3", "run-2"]
    with pytest.raises(ValueError, match="limit must be at least 1"):
        store.list_runs(limit=0)


def test_database_url_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    home = tmp_path / "home"
    assert database_url(load_config(overrides=[f"run.home={home}"])) == f"sqlite:///{home}/platform.db"
    assert home.is_dir()
    monkeypatch.setenv(ENV_DATABASE_URL, "postgresql://env@127.0.0.1/platform")
    assert database_url(load_config()) == "postgresql://env@127.0.0.1/platform"
    configured = load_config(overrides=["tracking.database_url='sqlite:///configured.db'"])
    assert database_url(configured) == "sqlite:///configured.db"


def test_urls_are_checked(tmp_path: Path) -> None:
    assert parse_url("postgres://u@h/db").get_backend_name() == "postgresql"
    with pytest.raises(PlatformDatabaseError, match="'not a url' is not a database URL"):
        parse_url("not a url")
    with pytest.raises(PlatformDatabaseError, match="unsupported database backend 'mysql'"):
        PlatformStore("mysql://user:secret@host/db")
    with pytest.raises(PlatformDatabaseError, match="cannot use the platform database") as missing_dir:
        PlatformStore(f"sqlite:///{tmp_path}/no/such/dir/platform.db")
    assert "secret" not in str(missing_dir.value)


def test_a_run_whose_heartbeat_stopped_is_marked_crashed_at_its_last_beat(store: PlatformStore) -> None:
    silent = create(store, "silent-run")
    alive = create(store, "alive-run")
    done = create(store, "done-run")
    store.finish_run(done, "finished", STARTED + timedelta(minutes=1))
    store.heartbeat(silent, STARTED + timedelta(minutes=5))
    store.heartbeat(alive, STARTED + timedelta(minutes=9))
    now = STARTED + timedelta(minutes=10)
    crashed = store.mark_silent_runs_crashed(now, stale_after_s=120)
    assert [run.id for run in crashed] == [silent]
    assert crashed[0].status == "crashed" and crashed[0].ended_at == STARTED + timedelta(minutes=5)
    statuses = {run.id: run.status for run in store.list_runs()}
    assert statuses == {silent: "crashed", alive: "running", done: "finished"}
    assert store.mark_silent_runs_crashed(now, stale_after_s=120) == []  # once
    store.heartbeat(silent, now)  # a late beat does not bring a crashed run back
    assert store.get_run(silent).run.status == "crashed"


def test_a_run_whose_launcher_is_gone_is_crashed_at_once_and_a_live_one_never(store: PlatformStore) -> None:
    gone = create(store, "gone-run", launcher={"pid": 1})
    alive = create(store, "alive-run", launcher={"pid": 2})
    elsewhere = create(store, "elsewhere-run", launcher={"pid": 3})
    verdicts = {1: "gone", 2: "alive", 3: "unknown"}
    for run_id in (gone, alive, elsewhere):
        store.heartbeat(run_id, STARTED + timedelta(minutes=9))

    def liveness(launcher):
        return verdicts[launcher["pid"]]

    # Heartbeats one minute old, 120 s allowed: only the proven-gone launcher's run is crashed.
    now = STARTED + timedelta(minutes=10)
    assert [r.id for r in store.mark_silent_runs_crashed(now, 120, liveness=liveness)] == [gone]
    # Much later: the live one is still not crashed; the one that cannot be checked from here is.
    later = STARTED + timedelta(hours=1)
    assert [r.id for r in store.mark_silent_runs_crashed(later, 120, liveness=liveness)] == [elsewhere]
    assert store.get_run(alive).run.status == "running"


def test_a_run_keeps_its_directory_and_launcher(store: PlatformStore) -> None:
    run_id = create(store, "kept", run_dir="/shared/runs/kept", launcher={"host": "h", "pid": 7})
    row = store.get_run(run_id).run
    assert row.run_dir == "/shared/runs/kept" and row.launcher == {"host": "h", "pid": 7}
    assert store.recorded_versions(run_id) == set()
    store.record_step(run_id, 3, {"rl/loss": 0.5}, [4])
    assert store.recorded_versions(run_id) == {3}
