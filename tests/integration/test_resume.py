"""A run whose launcher is killed (SIGKILL), as a user meets it: its stages die with it (parent-death
signal), the next ``pipelinerl runs list`` sees the launcher gone, marks the run crashed in the platform
database and in MLflow and writes what the run directory holds and the stores lacked (its tracker was
behind); then ``pipelinerl resume RUN`` goes on with it in place: the same run, from its newest
checkpoint, tracked in the same MLflow run and database row, and the prompt audit across both launchers
finds nothing skipped or trained twice. Real processes: the launcher is the ``pipelinerl run`` command,
killed while it trains; the resume is the ``pipelinerl resume`` command, given the run's id (found in the
platform database)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from pipelinerl.launch.resume import stage_processes
from pipelinerl.platform.prompt_records import audit_run
from pipelinerl.platform.restart_records import read_restarts
from pipelinerl.platform.tracking.db import database_url
from pipelinerl.platform.tracking.store import PlatformStore
from tests.conftest import wait_until, worker_port
from tests.integration.test_pipeline import small_config
from tests.integration.test_restart import _complete_lines, trained_to

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MAX_STEPS = 12
CHECKPOINT_EVERY = 3
PIPELINERL = Path(sys.executable).parent / "pipelinerl"


def command(*args: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([str(PIPELINERL), *args], stdout=log.open("wb"), stderr=subprocess.STDOUT)


def trained(run_dir: Path) -> tuple[list[int], set[str]]:
    """The versions and rollout ids of the run directory's trainer records (complete lines only)."""
    records = [json.loads(line) for line in _complete_lines(run_dir / "metrics.jsonl")]
    return [r["policy_version"] for r in records], {rollout for r in records for rollout, _ in r["rollouts"]}


def crashed_and_caught_up(run_dir: Path, launcher_pid: int, url: str) -> None:
    """What ``pipelinerl runs list`` makes of a run whose launcher is gone and whose stores are behind."""
    run_id = run_dir.name
    versions, rollout_ids = trained(run_dir)  # final: every stage is dead
    with PlatformStore(url) as store:
        before = store.get_run(run_id).run
        behind = set(versions) - store.recorded_versions(run_id)
    assert before.status == "running", "a killed launcher cannot mark its run"
    assert before.run_dir == str(run_dir.resolve()) and before.launcher["pid"] == launcher_pid
    assert behind, "the stores were not behind the run directory: nothing to catch up"
    # No wait for a heartbeat to go stale: the launcher was on this host, and its process is gone.
    listed = subprocess.run([str(PIPELINERL), "runs", "list"], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "run(s) crashed (launcher gone)" in listed.stdout and run_id in listed.stdout, listed.stdout
    assert f"caught up {run_id}: wrote {len(behind)} version(s)" in listed.stdout, listed.stdout
    with PlatformStore(url) as store:
        assert store.get_run(run_id).run.status == "crashed"
        assert store.recorded_versions(run_id) == set(versions)
        assert store.consumed_ids(run_id) == rollout_ids
        assert {v.version for v in store.get_run(run_id).policy_versions} >= set(versions)
    mlflow_run_id = (run_dir / "mlflow_run_id").read_text()
    client = mlflow.MlflowClient()
    assert client.get_run(mlflow_run_id).info.status == "FAILED"
    assert {point.step for point in client.get_metric_history(mlflow_run_id, "rl/loss")} == set(versions)
    again = subprocess.run([str(PIPELINERL), "runs", "list"], capture_output=True, text=True, timeout=120)
    assert f"caught up {run_id}" not in again.stdout, "a second listing finds nothing more to do"


def test_a_run_whose_launcher_was_killed_resumes_in_place_and_loses_no_prompt(tmp_path, random_model_dir):
    overrides = [
        "task.eval_problems=4",  # held-out success is measured at the start and the end: not the subject
        f"run.max_steps={MAX_STEPS}",
        f"trainer.checkpoint_every={CHECKPOINT_EVERY}",
        f"transport.base_port={worker_port(28500)}",
        "rl.truncated=penalise",
        "rl.drop_zero_variance_groups=true",  # prompts a checkpoint skipped over, handed out again
        # The tracker writes every 60 s, so the stores are behind the run directory when it is killed.
        "tracking.flush_interval_s=60",
    ]
    config = small_config(tmp_path, random_model_dir, *overrides)  # what the command line below sets
    args = [f"model.path={random_model_dir}", f"run.output_dir={tmp_path}", f"run.home={tmp_path / 'home'}"]
    args += ["rl.group_size=4", "rl.batch_size=16", "actor.max_in_flight=16"]
    args += overrides
    launcher = command("run", *(item for arg in args for item in ("--set", arg)), log=tmp_path / "run.log")
    run_dir = wait_until(
        lambda: (
            launcher.poll() is None
            and next((d for d in tmp_path.iterdir() if (d / "config.json").is_file()), None)
        ),
        timeout_s=300,
        what="the run's directory",
    )
    refused = subprocess.run([str(PIPELINERL), "resume", str(run_dir)], capture_output=True, text=True)
    assert refused.returncode == 2 and "is still running" in refused.stdout, refused.stdout + refused.stderr
    wait_until(
        lambda: launcher.poll() is None and trained_to(run_dir) > CHECKPOINT_EVERY,
        timeout_s=300,
        what=f"version {CHECKPOINT_EVERY + 1} trained (after the first checkpoint)",
    )
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    # The launcher alone was killed: its stages, in process groups of their own, go by themselves.
    wait_until(lambda: not stage_processes(run_dir), timeout_s=60, what="the killed launcher's stages gone")
    killed_at = trained_to(run_dir)
    crashed_and_caught_up(run_dir, launcher.pid, database_url(config))

    resumed = command("resume", run_dir.name, log=tmp_path / "resume.log")  # by its id, from the database
    assert resumed.wait(timeout=500) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    assert not stage_processes(run_dir)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_policy_version"] == MAX_STEPS and summary["restarts"] == 1
    [restart] = read_restarts(run_dir)
    assert "launcher" in restart["reason"] and "pipelinerl resume" in restart["reason"], restart
    assert restart["resumed_from_version"] == CHECKPOINT_EVERY * (killed_at // CHECKPOINT_EVERY)
    assert restart["actors_restarted"] is True
    versions = [json.loads(line)["policy_version"] for line in _complete_lines(run_dir / "metrics.jsonl")]
    assert versions == list(range(1, MAX_STEPS + 1))  # each version once: the discarded ones set aside

    audit = audit_run(run_dir, ranks=1)
    [actor] = audit.actors
    print("prompt audit across the two launchers:", actor)
    assert audit.ok and actor.skipped == [] and actor.trained_twice == [], actor
    assert actor.trained_once >= MAX_STEPS * 16 // 4
    with PlatformStore(database_url(config)) as store:
        row = store.get_run(run_dir.name).run
        assert row.status == "finished" and row.run_dir == str(run_dir)
        assert store.prompt_records(run_dir.name).audit() == audit  # the ledger saw both launchers
    run = mlflow.MlflowClient().get_run((run_dir / "mlflow_run_id").read_text())
    assert run.info.status == "FINISHED"

    again = subprocess.run([str(PIPELINERL), "resume", str(run_dir)], capture_output=True, text=True)
    assert again.returncode == 2 and "finished" in again.stdout, again.stdout + again.stderr
