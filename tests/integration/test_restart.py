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
from tests.conftest import worker_port
from tests.integration.test_pipeline import small_config as pipeline_config

pytestmark = pytest.mark.slow


# Its own ports: test_pipeline's counter may be a second module object under xdist, from the same base.
_next_port = iter(range(worker_port(27950), worker_port(28000), 10))


def small_config(tmp_path: Path, model_dir: Path, *overrides: str):
    return pipeline_config(
        tmp_path,
        model_dir,
        "trainer.checkpoint_every=2",
        f"transport.base_port={next(_next_port)}",
        *overrides,
    )


def stage_processes(run_dir: Path, marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if str(run_dir) in cmdline and marker in cmdline and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process)
    return found


class Crasher(threading.Thread):
    """Once the trainer has logged ``at_version`` (and its checkpoints so far are complete),
    SIGKILLs the stage of the run whose command line has ``marker`` (actor 0's by default), once."""

    def __init__(self, run_dir: Path, at_version: int, marker: str = "--actor-id 0") -> None:
        super().__init__(daemon=True)
        self.run_dir = run_dir
        self.at_version = at_version
        self.marker = marker
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
                for process in stage_processes(self.run_dir, self.marker):
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


STAGES = {
    "actor0": "--actor-id 0",
    "preprocessor": "pipelinerl.workers.preprocessor",
    "trainer0": "pipelinerl.workers.trainer",
}


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_crashed_stage_restarts_every_stage_from_the_latest_checkpoint(tmp_path, random_model_dir, stage):
    """Checkpoints at 3 and 6; the stage is killed (SIGKILL) once version 4 is trained. Every stage
    starts again from the checkpoint at 3 (6 if the trainer got there first); the versions after it
    are discarded and trained again, and every store then describes the attempt the final policy
    descends from."""
    from pipelinerl.platform.checkpoint import read_trained
    from pipelinerl.platform.tracking.db import database_url
    from pipelinerl.platform.tracking.store import PlatformStore

    config = small_config(
        tmp_path, random_model_dir, "run.max_steps=8", "run.max_restarts=1", "trainer.checkpoint_every=3"
    )
    run_id = f"restart-{stage}"
    run_dir = tmp_path / run_id
    crasher = Crasher(run_dir, at_version=4, marker=STAGES[stage])
    crasher.start()
    result = launch(config, run_id=run_id)
    crasher.join(timeout=5)
    assert crasher.killed_pid is not None, f"{stage} was killed mid-run"

    summary = result.summary
    assert summary["restarts"] == 1
    assert summary["final_policy_version"] == 8
    # Every stage started again from the newest complete checkpoint before the crash.
    restarted = json.loads((run_dir / "config.json").read_text())
    initial = json.loads((run_dir / "config.initial.json").read_text())
    assert initial["run"]["resume_from"] is None
    checkpoint = Path(restarted["run"]["resume_from"])
    assert checkpoint.parent == run_dir / "checkpoints"
    resumed = read_info(checkpoint).policy_version
    assert resumed in (3, 6)
    assert read_info(run_dir / "final").policy_version == 8
    trainer_log = (run_dir / "logs" / "trainer0.log").read_text()
    assert f"resumed from {checkpoint}" in trainer_log
    assert not stage_processes(run_dir, "pipelinerl.workers")

    # The run directory: each version once, as the surviving attempt trained it; the rest set aside.
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in records] == list(range(1, 9))
    assert [r["policy_version"] for r in result.records] == list(range(1, 9))
    aside = run_dir / "discarded" / "attempt1" / "metrics.jsonl"
    thrown = [json.loads(line) for line in aside.read_text().splitlines()] if aside.exists() else []
    [restart] = [json.loads(line) for line in (run_dir / "restarts.jsonl").read_text().splitlines()]
    assert restart["attempt"] == 1 and stage in restart["reason"], restart
    assert restart["resumed_from_version"] == resumed
    assert restart["discarded_versions"] == [r["policy_version"] for r in thrown]
    assert all(v > resumed for v in restart["discarded_versions"])
    assert restart["discarded_rollouts"] == sum(len(r["rollouts"]) for r in thrown)
    assert restart["lost_in_flight"] >= 0
    assert summary["discarded"] == [restart]
    print("restart figures:", json.dumps(restart))
    if resumed == 3:
        assert 4 in restart["discarded_versions"], "version 4 was trained before the kill"
    survivors = {r["policy_version"]: r for r in records}
    for discarded in thrown:  # redone from other rollouts: the records are the second attempt's
        redone = survivors[discarded["policy_version"]]
        assert redone["time"] > discarded["time"]
        assert not {tuple(x) for x in redone["rollouts"]} & {tuple(x) for x in discarded["rollouts"]}

    # No rollout trained twice into the final policy; the checkpoint knew what it was trained on.
    trained = [rollout_id for r in records for rollout_id, _ in r["rollouts"]]
    assert len(trained) == len(set(trained)) == 8 * 16
    before = read_trained(checkpoint)
    assert set(before.rollout_ids) == {rid for r in records[:resumed] for rid, _ in r["rollouts"]}
    position = before.prompt_positions[0]
    assert position > 0
    assert (
        f"actor 0: prompt stream resumes at position {position}"
        in (run_dir / "logs" / "actor0.log").read_text()
    )

    # The platform database: the surviving versions' statistics; the ledger holds exactly their rollouts.
    with PlatformStore(database_url(config)) as store:
        detail = store.get_run(run_id)
        ledger = store.consumed_ids(run_id)
    assert [step.version for step in detail.steps] == list(range(1, 9))
    for step in detail.steps:
        assert step.ess == pytest.approx(survivors[step.version]["rl/ess"])
    assert ledger == set(trained)

    # MLflow: the later point of each step is the surviving attempt's; the restart is said.
    client = mlflow.MlflowClient()
    run = client.get_run((run_dir / "mlflow_run_id").read_text())
    assert run.info.status == "FINISHED"
    assert [m.value for m in client.get_metric_history(run.info.run_id, "run/restarts")] == [1.0]
    discarded_count = client.get_metric_history(run.info.run_id, "restart/discarded_versions")
    assert [m.value for m in discarded_count] == [float(len(restart["discarded_versions"]))]
    assert f"resumed from version {resumed}" in run.data.tags["pipelinerl.restart.1"]
    ess = client.get_metric_history(run.info.run_id, "rl/ess")
    latest: dict[int, tuple[int, float]] = {}
    for point in ess:
        if point.step not in latest or point.timestamp >= latest[point.step][0]:
            latest[point.step] = (point.timestamp, point.value)
    assert sorted(latest) == list(range(1, 9))
    for version, (_, value) in latest.items():
        assert value == pytest.approx(survivors[version]["rl/ess"]), version
