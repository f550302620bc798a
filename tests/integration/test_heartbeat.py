"""A launcher killed with SIGKILL leaves its run marked running and its stores behind its run directory;
its stages go too (parent-death signal), and the next `pipelinerl runs list` sees the launcher gone (on
this host, at once), marks the run crashed in the platform database and in MLflow, and writes both
what the run directory holds and they lack.

One run, launched with the command and killed once for the module; each test checks one property."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from pipelinerl.platform.config import load_config
from pipelinerl.platform.jsonl import JsonlTail
from pipelinerl.platform.tracking.db import database_url
from pipelinerl.platform.tracking.store import PlatformStore
from tests.conftest import wait_until, worker_port

pytestmark = pytest.mark.slow


def _cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelinerl.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _trained(run_dir: Path) -> tuple[list[int], set[str]]:
    """The versions and rollout ids of the run directory's trainer records (complete lines only)."""
    records = JsonlTail(run_dir / "metrics.jsonl").read()
    return [r["policy_version"] for r in records], {rollout for r in records for rollout, _ in r["rollouts"]}


def _processes_of(run_dir: Path) -> list:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(str(run_dir) in part for part in process.info["cmdline"] or []):
            found.append(process)
    return found


@dataclass
class Killed:
    launcher_pid: int
    run_dir: Path
    database: str  # the --set of the run's own platform database
    url: str  # its URL
    home: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def killed(tmp_path_factory, random_model_dir) -> Killed:
    """``pipelinerl run`` SIGKILLed (the launcher alone) once the run directory holds versions its
    stores lack."""
    tmp_path = tmp_path_factory.mktemp("heartbeat")
    home = tmp_path / "home"
    # Its own platform database: the session's is shared with tests that kill launchers of their own.
    database = f"tracking.database_url=sqlite:///{tmp_path / 'platform.db'}"
    settings = [
        database,
        f"model.path={random_model_dir}",
        f"run.output_dir={tmp_path / 'runs'}",
        f"run.home={home}",
        "run.max_steps=500",
        "rl.group_size=4",
        "rl.batch_size=8",
        "actor.max_in_flight=8",
        "task.eval_problems=8",
        # The tracker writes every 60 s, so the stores are behind the run directory when it is killed.
        "tracking.flush_interval_s=60",
        f"transport.base_port={worker_port(27850)}",
    ]
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("MLFLOW_TRACKING_URI", None)
    url = database_url(load_config(None, [f"run.home={home}", database]))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "pipelinerl.cli", "run", *[f"--set={s}" for s in settings]],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def ahead_of_the_stores() -> Path | None:
        assert launcher.poll() is None, "the run ended before it could be killed"
        run_dirs = [m.parent for m in (tmp_path / "runs").glob("*/metrics.jsonl")]
        if run_dirs and len(versions := _trained(run_dirs[0])[0]) >= 3:
            with PlatformStore(url) as store:
                if set(versions) - store.recorded_versions(run_dirs[0].name):
                    return run_dirs[0]  # the run directory holds versions the database lacks
        return None

    try:
        run_dir = wait_until(
            ahead_of_the_stores, timeout_s=300, what="three steps ahead of the stores", interval_s=0.5
        )
        # The launcher alone: its stages are in process groups of their own and must go by themselves.
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    return Killed(launcher.pid, run_dir, database, url, home, env)


def _stages_gone(killed: Killed) -> None:
    wait_until(
        lambda: not _processes_of(killed.run_dir),
        timeout_s=60,
        what="the stages of the SIGKILLed launcher to exit (orphaned stage processes)",
        interval_s=0.5,
    )


def test_stages_die_with_a_killed_launcher(killed):
    """SIGKILL gives the launcher no chance to clean up; the stages must still go (parent-death signal)."""
    _stages_gone(killed)
    assert _processes_of(killed.run_dir) == [], "orphaned stage processes"


def test_a_killed_launcher_s_run_is_marked_crashed_and_caught_up_by_runs_list(killed):
    _stages_gone(killed)
    run_dir, url, env = killed.run_dir, killed.url, killed.env
    run_id = run_dir.name
    versions, rollout_ids = _trained(run_dir)  # final: every stage is dead
    with PlatformStore(url) as store:
        before = store.get_run(run_id).run
        behind = set(versions) - store.recorded_versions(run_id)
    assert before.status == "running", "a killed launcher cannot mark its run"
    assert before.run_dir == str(run_dir.resolve()) and before.launcher["pid"] == killed.launcher_pid
    assert behind, "the stores were not behind the run directory: nothing to catch up"
    set_home = [f"--set=run.home={killed.home}", f"--set={killed.database}"]
    # No wait for a heartbeat to go stale: the launcher was on this host, and its process is gone.
    listed = _cli("runs", "list", *set_home, env=env)
    assert listed.returncode == 0, listed.stderr
    assert f"marked 1 run(s) crashed (launcher gone): {run_id}" in listed.stdout, listed.stdout
    assert f"caught up {run_id}: wrote {len(behind)} version(s)" in listed.stdout, listed.stdout
    with PlatformStore(url) as store:
        assert store.recorded_versions(run_id) == set(versions)
        assert store.consumed_ids(run_id) == rollout_ids
        assert {v.version for v in store.get_run(run_id).policy_versions} >= set(versions)
    shown = _cli("runs", "show", run_id, *set_home, env=env)
    assert "crashed" in shown.stdout
    mlflow_run_id = (run_dir / "mlflow_run_id").read_text()
    client = MlflowClient(tracking_uri=f"sqlite:///{killed.home / 'mlflow.db'}")
    assert client.get_run(mlflow_run_id).info.status == "FAILED"
    assert {point.step for point in client.get_metric_history(mlflow_run_id, "rl/loss")} == set(versions)
    summary = run_dir / "summary.json"
    assert not summary.exists() or json.loads(summary.read_text()).get("status") != "finished"
    # A second listing finds nothing more to do.
    again = _cli("runs", "list", *set_home, env=env)
    assert "marked" not in again.stdout and "caught up" not in again.stdout
