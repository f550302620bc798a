"""A launcher killed with SIGKILL leaves its run marked running; its heartbeat stops, and the next
`pipelinerl runs list` marks the run crashed, in the platform database and in MLflow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import worker_port

pytestmark = pytest.mark.slow


def _cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelinerl.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_killed_launcher_s_run_is_marked_crashed_by_runs_list(tmp_path, random_model_dir):
    from mlflow.tracking import MlflowClient

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
        f"transport.base_port={worker_port(27850)}",
    ]
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("MLFLOW_TRACKING_URI", None)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "pipelinerl.cli", "run", *[f"--set={s}" for s in settings]],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 200
        metrics: list[Path] = []
        while time.monotonic() < deadline and not any(m.stat().st_size for m in metrics):
            assert launcher.poll() is None, "the run ended before it could be killed"
            time.sleep(1)
            metrics = list((tmp_path / "runs").glob("*/metrics.jsonl"))
        assert metrics, "no step within 200 s"
        os.killpg(launcher.pid, signal.SIGKILL)  # the launcher and whatever shares its session
        launcher.wait(timeout=30)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    run_id = metrics[0].parent.name
    from pipelinerl.platform.config import load_config
    from pipelinerl.platform.tracking.db import database_url
    from pipelinerl.platform.tracking.store import PlatformStore

    with PlatformStore(database_url(load_config(None, [f"run.home={home}", database]))) as store:
        before = store.get_run(run_id).run
    assert before.status == "running", "a killed launcher cannot mark its run"
    assert before.heartbeat_at is not None and before.heartbeat_at > before.started_at, "it beat while it ran"
    set_home = [f"--set=run.home={home}", f"--set={database}"]
    time.sleep(3)
    listed = _cli("runs", "list", "--silent-after", "2", *set_home, env=env)
    assert listed.returncode == 0, listed.stderr
    assert f"marked 1 run(s) crashed, silent for over 2 s: {run_id}" in listed.stdout, listed.stdout
    shown = _cli("runs", "show", run_id, *set_home, env=env)
    assert "crashed" in shown.stdout
    mlflow_run_id = (metrics[0].parent / "mlflow_run_id").read_text()
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    assert client.get_run(mlflow_run_id).info.status == "FAILED"
    summary = metrics[0].parent / "summary.json"
    assert not summary.exists() or json.loads(summary.read_text()).get("status") != "finished"
