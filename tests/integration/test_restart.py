"""A stage that crashes mid-run: the run fails with its log tail, or every stage starts again from
the latest checkpoint when ``run.max_restarts`` allows. Real processes; the crash is a SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import mlflow
import psutil
import pytest

from pipelinerl.launch.launcher import StageFailed, launch
from pipelinerl.platform.checkpoint import read_info
from tests.integration.test_pipeline import small_config as pipeline_config

pytestmark = pytest.mark.slow


def small_config(tmp_path: Path, model_dir: Path, *overrides: str):
    return pipeline_config(tmp_path, model_dir, "trainer.checkpoint_every=2", *overrides)


def stage_processes(run_dir: Path, marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if str(run_dir) in cmdline and marker in cmdline and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process)
    return found


class Crasher(threading.Thread):
    """Once the trainer has logged ``at_version`` (and its checkpoints so far are complete),
    SIGKILLs the actor 0 process of the run, once."""

    def __init__(self, run_dir: Path, at_version: int) -> None:
        super().__init__(daemon=True)
        self.run_dir = run_dir
        self.at_version = at_version
        self.killed_pid: int | None = None

    def trained_to(self) -> int:
        metrics = self.run_dir / "metrics.jsonl"
        if not metrics.exists():
            return 0
        versions = [json.loads(line)["policy_version"] for line in metrics.read_text().splitlines() if line]
        return max(versions, default=0)

    def run(self) -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if self.trained_to() >= self.at_version:
                for process in stage_processes(self.run_dir, "--actor-id 0"):
                    self.killed_pid = process.pid
                    os.kill(process.pid, signal.SIGKILL)
                    return
            time.sleep(0.1)


def test_a_crashed_stage_fails_the_run_with_its_log_tail(tmp_path, random_model_dir):
    config = small_config(tmp_path, random_model_dir, "run.max_steps=40")
    run_dir = tmp_path / "crash"
    crasher = Crasher(run_dir, at_version=2)
    crasher.start()
    with pytest.raises(StageFailed, match=r"stage actor0 exited with code -9 .*last lines of .*actor0\.log"):
        launch(config, run_id="crash")
    assert crasher.killed_pid is not None
    assert not stage_processes(run_dir, "pipelinerl.workers"), "no stage outlives the failed run"
    run = mlflow.MlflowClient().get_run((run_dir / "mlflow_run_id").read_text())
    assert run.info.status == "FAILED"
    assert not (run_dir / "summary.json").exists()


def test_a_crashed_stage_restarts_every_stage_from_the_latest_checkpoint(tmp_path, random_model_dir):
    config = small_config(tmp_path, random_model_dir, "run.max_steps=6", "run.max_restarts=1")
    run_dir = tmp_path / "restart"
    crasher = Crasher(run_dir, at_version=3)
    crasher.start()
    result = launch(config, run_id="restart")
    crasher.join(timeout=5)
    assert crasher.killed_pid is not None, "the actor was killed mid-run"

    summary = result.summary
    assert summary["restarts"] == 1
    assert summary["final_policy_version"] == 6
    assert [r["policy_version"] for r in result.records] == [1, 2, 3, 4, 5, 6], "each version once"
    # Every stage started again from the newest complete checkpoint before the crash.
    restarted = json.loads((run_dir / "config.json").read_text())
    initial = json.loads((run_dir / "config.initial.json").read_text())
    assert initial["run"]["resume_from"] is None
    checkpoint = Path(restarted["run"]["resume_from"])
    assert checkpoint.parent == run_dir / "checkpoints"
    assert read_info(checkpoint).policy_version in (2, 4)
    assert read_info(run_dir / "final").policy_version == 6
    trainer_log = (run_dir / "logs" / "trainer0.log").read_text()
    assert f"resumed from {checkpoint}" in trainer_log
    assert not stage_processes(run_dir, "pipelinerl.workers")

    client = mlflow.MlflowClient()
    run = client.get_run((run_dir / "mlflow_run_id").read_text())
    assert run.info.status == "FINISHED"
    restarts = client.get_metric_history(run.info.run_id, "run/restarts")
    assert [m.value for m in restarts] == [1.0]
    ess = client.get_metric_history(run.info.run_id, "rl/ess")
    assert sorted(m.step for m in ess) == [1, 2, 3, 4, 5, 6], (
        "versions redone after the restart are logged once"
    )
