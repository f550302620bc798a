"""A stage that crashes mid-run: the run fails with its log tail, or restarts from the latest
checkpoint when ``run.max_restarts`` allows: the trainer role alone (the actors keep their engines,
``platform/rebase.py``) after a trainer rank or the preprocessor, every stage after an actor. Real
processes; the crash is a SIGKILL.

One run restarts three times, each after a different stage was killed (the trainer, then the
preprocessor, then actor 0); the module's tests each check one property of that run. Another,
with no restart allowed, fails with the killed stage's log tail.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import psutil
import pytest

from pipelinerl.launch.launcher import RunResult, StageFailed, launch
from pipelinerl.platform.checkpoint import checkpoint_dir, read_info, read_trained
from pipelinerl.platform.prompt_records import audit_run
from pipelinerl.platform.tracking.db import database_url
from pipelinerl.platform.tracking.store import PlatformStore
from tests.conftest import wait_until, worker_port
from tests.integration.test_pipeline import small_config as pipeline_config

# The module's run (set up by its first test) has three restarts: room for a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


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


def _complete_lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    text = path.read_text()
    return [line for line in text.splitlines()[: text.count("\n")] if line.strip()]


def trained_to(run_dir: Path) -> int:
    """The newest policy version in the run directory's trainer records (0 before the first)."""
    versions = [json.loads(line)["policy_version"] for line in _complete_lines(run_dir / "metrics.jsonl")]
    return max(versions, default=0)


def checkpointed_last(run_dir: Path) -> bool:
    """The trainer's newest record is of a step it saved a checkpoint of."""
    lines = _complete_lines(run_dir / "metrics.jsonl")
    return bool(lines) and "checkpoint" in json.loads(lines[-1])


def actor_runs(run_dir: Path, actor_id: int = 0) -> int:
    """The version of the newest update the actor loaded (-1 before the first)."""
    lines = _complete_lines(run_dir / f"actor{actor_id}.jsonl")
    return json.loads(lines[-1])["policy_version"] if lines else -1


def restarts_so_far(run_dir: Path) -> int:
    return len(_complete_lines(run_dir / "restarts.jsonl"))


class Launched:
    """``launch`` on a thread, so the test can kill its stages meanwhile; ``finish`` returns its result."""

    def __init__(self, config, run_id: str) -> None:
        self.outcome: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run, args=(config, run_id), daemon=True)
        self.thread.start()

    def _run(self, config, run_id: str) -> None:
        try:
            self.outcome["result"] = launch(config, run_id=run_id)
        except BaseException as error:  # handed to the test by finish()
            self.outcome["error"] = error

    def running(self) -> bool:
        if not self.thread.is_alive():
            pytest.fail(f"the run ended before the test was done with it: {self.outcome}")
        return True

    def finish(self, timeout_s: float = 900) -> RunResult:
        self.thread.join(timeout=timeout_s)
        assert not self.thread.is_alive(), f"the run did not end within {timeout_s:.0f} s"
        if "error" in self.outcome:
            raise self.outcome["error"]
        return self.outcome["result"]


def kill_stage(
    launched: Launched, run_dir: Path, marker: str, at_version: int, after_restarts: int = 0
) -> int:
    """SIGKILL the run's stage whose command line has ``marker``, once the attempt after
    ``after_restarts`` restarts has trained ``at_version`` (its checkpoints so far are complete)."""

    def due() -> list[psutil.Process]:
        launched.running()
        if restarts_so_far(run_dir) != after_restarts or trained_to(run_dir) < at_version:
            return []
        return stage_processes(run_dir, marker)

    [victim, *_] = wait_until(
        due,
        timeout_s=300,
        what=f"version {at_version} trained after {after_restarts} restart(s), and a {marker!r} process",
    )
    os.kill(victim.pid, signal.SIGKILL)
    return victim.pid


def test_a_crashed_stage_fails_the_run_with_its_log_tail(tmp_path, random_model_dir):
    config = small_config(tmp_path, random_model_dir, "run.max_steps=40")
    run_dir = tmp_path / "crash"
    launched = Launched(config, "crash")
    kill_stage(launched, run_dir, "--actor-id 0", at_version=2)
    with pytest.raises(StageFailed, match=r"stage actor0 exited with code -9 .*last lines of .*actor0\.log"):
        launched.finish()
    assert not stage_processes(run_dir, "pipelinerl.workers"), "no stage outlives the failed run"
    run = mlflow.MlflowClient().get_run((run_dir / "mlflow_run_id").read_text())
    assert run.info.status == "FAILED"
    assert not (run_dir / "summary.json").exists()


def kill_trainer_while_the_actor_runs_a_checkpoint(launched: Launched, run_dir: Path) -> int:
    """SIGKILL trainer rank 0 while actor 0's engine runs the version of the newest checkpoint, which the
    restart resumes from: the actor's train groups then in flight are valid in the resumed lineage and
    kept. At each checkpoint the trainer is stopped (SIGSTOP), and killed if the actor runs that version
    (an update the trainer was stopped in the middle of never loads); else it goes on to the next."""
    while True:
        [trainer, *_] = wait_until(
            lambda: (
                launched.running()
                and checkpointed_last(run_dir)
                and stage_processes(run_dir, KILLED["trainer0"])
            ),
            timeout_s=300,
            what="a trainer step that saved a checkpoint",
        )
        version = trained_to(run_dir)
        os.kill(trainer.pid, signal.SIGSTOP)
        # The actor loads an update before the trainer records its step: at once, as a rule. Killed
        # without delay, the actor still has its groups in flight (stopped longer, the trainer's queue
        # fills, the actor stops admitting and its groups finish: nothing whole is left to keep).
        deadline = time.monotonic() + 2.0
        while actor_runs(run_dir) < version and time.monotonic() < deadline:
            time.sleep(0.02)
        if trained_to(run_dir) == version and actor_runs(run_dir) == version:
            os.kill(trainer.pid, signal.SIGKILL)
            return version
        os.kill(trainer.pid, signal.SIGCONT)
        wait_until(lambda v=version: launched.running() and trained_to(run_dir) > v, 300, "the next version")


# The stages killed one after another in the restarting run: the trainer while the actor runs a
# checkpoint's version (3k), then, once the k-th attempt (k = 2, 3) has trained version 3k + 1, the
# preprocessor and actor 0; checkpoints every 3 versions, so each resumes from the newest checkpoint
# then. The run ends at MAX_STEPS.
KILLED = {
    "trainer0": "pipelinerl.workers.trainer",
    "preprocessor": "pipelinerl.workers.preprocessor",
    "actor0": "--actor-id 0",
}
CHECKPOINT_EVERY = 3
MAX_STEPS = 13
BATCH = 16


@dataclass
class Restarted:
    config: Any
    run_id: str
    run_dir: Path
    result: RunResult
    restarts: list[dict[str, Any]]  # restarts.jsonl, in order: one per killed stage
    resumed: list[int]  # the version each restart resumed from
    records: list[dict[str, Any]]  # metrics.jsonl at the end
    thrown: list[dict[str, Any]]  # every discarded trainer record, of every attempt
    actor_survived: bool  # the actor killed last was the process started first
    killed_at: list[float]  # when each stage was killed

    def checkpoint(self, attempt: int) -> Path:
        return checkpoint_dir(self.run_dir, self.resumed[attempt - 1])


@pytest.fixture(scope="module")
def restarted(tmp_path_factory, random_model_dir) -> Restarted:
    tmp_path = tmp_path_factory.mktemp("restart")
    config = small_config(
        tmp_path,
        random_model_dir,
        f"run.max_steps={MAX_STEPS}",
        f"run.max_restarts={len(KILLED)}",
        f"trainer.checkpoint_every={CHECKPOINT_EVERY}",
        # Groups whose four rewards are equal are dropped (about one in seven here): prompts a checkpoint's
        # policy was not trained on though later ones were, which a resumed actor must hand out again.
        "rl.truncated=penalise",
        "rl.drop_zero_variance_groups=true",
    )
    run_id = "restart"
    run_dir = tmp_path / run_id
    launched = Launched(config, run_id)
    [first_actor] = wait_until(
        lambda: launched.running() and stage_processes(run_dir, KILLED["actor0"]), 300, "actor 0's process"
    )
    at_checkpoint = kill_trainer_while_the_actor_runs_a_checkpoint(launched, run_dir)
    killed_at = [time.time()]
    kill_stage(launched, run_dir, KILLED["preprocessor"], at_version=at_checkpoint + 1, after_restarts=1)
    killed_at.append(time.time())
    last_actor = kill_stage(
        launched,
        run_dir,
        KILLED["actor0"],
        at_version=max(at_checkpoint + 1, 2 * CHECKPOINT_EVERY) + 1,
        after_restarts=2,
    )
    killed_at.append(time.time())
    result = launched.finish()
    restarts = [json.loads(line) for line in _complete_lines(run_dir / "restarts.jsonl")]
    print("restart figures:", json.dumps(restarts))
    thrown: list[dict[str, Any]] = []
    for attempt in range(1, len(restarts) + 1):
        aside = run_dir / "discarded" / f"attempt{attempt}" / "metrics.jsonl"
        thrown.extend(json.loads(line) for line in _complete_lines(aside))
    # Every step trained, of every attempt: the first after a kill is the first of the restarted stages.
    steps = [json.loads(line) for line in _complete_lines(run_dir / "metrics.jsonl")] + thrown
    recovery = [min(r["time"] for r in steps if r["time"] > at) - at for at in killed_at]
    print("seconds from each kill to the next optimizer step:", [round(s, 1) for s in recovery])
    return Restarted(
        config=config,
        run_id=run_id,
        run_dir=run_dir,
        result=result,
        restarts=restarts,
        resumed=[r["resumed_from_version"] for r in restarts],
        records=[json.loads(line) for line in _complete_lines(run_dir / "metrics.jsonl")],
        thrown=thrown,
        actor_survived=last_actor == first_actor.pid,
        killed_at=killed_at,
    )


def test_each_restart_resumes_from_the_latest_checkpoint_and_only_an_actor_crash_restarts_the_actors(
    restarted,
):
    run_dir = restarted.run_dir
    summary = restarted.result.summary
    assert summary["restarts"] == len(KILLED)
    assert summary["final_policy_version"] == MAX_STEPS
    assert read_info(run_dir / "final").policy_version == MAX_STEPS
    assert [r["attempt"] for r in restarted.restarts] == [1, 2, 3], restarted.restarts
    trainer_log = (run_dir / "logs" / "trainer0.log").read_text()
    actor_log = (run_dir / "logs" / "actor0.log").read_text()
    resumed_before = 0
    for attempt, (stage, restart) in enumerate(zip(KILLED, restarted.restarts, strict=True), start=1):
        assert stage in restart["reason"], restart
        # Each restart resumed from the newest complete checkpoint before the crash.
        resumed = restart["resumed_from_version"]
        assert resumed % CHECKPOINT_EVERY == 0 and resumed >= max(resumed_before, CHECKPOINT_EVERY), restart
        resumed_before = resumed
        checkpoint = restarted.checkpoint(attempt)
        assert read_info(checkpoint).policy_version == resumed
        assert f"resumed from {checkpoint}" in trainer_log, stage
    # The trainer's and the preprocessor's crashes restarted the trainer role alone: the actor paused,
    # kept its engine and took the checkpoint's weights from the restarted trainer; only the actor's own
    # crash restarted the actors (and the actor killed then was the process the run started with).
    assert [r["actors_restarted"] for r in restarted.restarts] == [False, False, True]
    assert restarted.actor_survived
    for restart in restarted.restarts[:2]:
        assert f"paused for the restart from version {restart['resumed_from_version']}" in actor_log
    assert trainer_log.count("to the actors that outlived the restart") == 2
    # Killed while the actor ran the checkpoint's version: every whole group in flight was valid, kept.
    assert restarted.restarts[0]["discarded_versions"] == []
    assert restarted.restarts[0]["kept_in_actors"] > 0, restarted.restarts[0]
    assert restarted.restarts[0]["kept_in_actors"] % restarted.config.rl.group_size == 0
    # The stages read the last restart's checkpoint from config.json; the first config is kept.
    current = json.loads((run_dir / "config.json").read_text())
    initial = json.loads((run_dir / "config.initial.json").read_text())
    assert initial["run"]["resume_from"] is None
    assert Path(current["run"]["resume_from"]) == restarted.checkpoint(len(KILLED))
    assert not stage_processes(run_dir, "pipelinerl.workers")


def test_the_run_directory_keeps_each_version_once_and_sets_the_discarded_aside(restarted):
    """Each version once, as the surviving attempt trained it; the rest set aside, each restart's
    figures saying what it threw away."""
    records, run_dir = restarted.records, restarted.run_dir
    assert [r["policy_version"] for r in records] == list(range(1, MAX_STEPS + 1))
    assert [r["policy_version"] for r in restarted.result.records] == list(range(1, MAX_STEPS + 1))
    for attempt, restart in enumerate(restarted.restarts, start=1):
        aside = run_dir / "discarded" / f"attempt{attempt}" / "metrics.jsonl"
        thrown = [json.loads(line) for line in _complete_lines(aside)]
        resumed = restart["resumed_from_version"]
        assert restart["discarded_versions"] == [r["policy_version"] for r in thrown]
        assert all(v > resumed for v in restart["discarded_versions"])
        assert restart["discarded_rollouts"] == sum(len(r["rollouts"]) for r in thrown)
        assert restart["lost_in_flight"] >= 0
        if attempt > 1 and resumed == restarted.restarts[attempt - 2]["resumed_from_version"]:
            killed_at = resumed + 1  # the attempt had trained it when its stage was killed
            assert killed_at in restart["discarded_versions"], (
                f"version {killed_at} was trained before the kill"
            )
    assert restarted.result.summary["discarded"] == restarted.restarts
    survivors = {r["policy_version"]: r for r in records}
    for discarded in restarted.thrown:  # redone from other rollouts: the records are a later attempt's
        redone = survivors[discarded["policy_version"]]
        assert redone["time"] > discarded["time"]
        assert not {tuple(x) for x in redone["rollouts"]} & {tuple(x) for x in discarded["rollouts"]}


def test_no_rollout_is_trained_twice_and_each_checkpoint_knew_what_it_was_trained_on(restarted):
    records = restarted.records
    trained = [rollout_id for r in records for rollout_id, _ in r["rollouts"]]
    assert len(trained) == len(set(trained)) == MAX_STEPS * BATCH
    actor_log = (restarted.run_dir / "logs" / "actor0.log").read_text()
    for attempt, resumed in enumerate(restarted.resumed, start=1):
        before = read_trained(restarted.checkpoint(attempt))
        assert set(before.rollout_ids) == {rid for r in records[:resumed] for rid, _ in r["rollouts"]}
        position = before.prompt_positions[0]
        assert position > 0
        assert f"actor 0: prompt stream resumes at position {position}" in actor_log, attempt


def test_no_prompt_is_skipped_or_trained_twice_across_the_restarts(restarted):
    """``pipelinerl runs audit``: every prompt the actor handed out, in any attempt, was trained exactly
    once in the surviving lineage, dropped with its reason (equal rewards here), or in flight at the end.
    A resumed actor hands out again, first, the prompts its checkpoint's policy was not trained on though
    it was trained on later ones (dropped, or in flight when the checkpoint was saved)."""
    audit = audit_run(restarted.run_dir, ranks=1)
    [actor] = audit.actors
    print("prompt audit:", actor)
    assert actor.skipped == [] and actor.trained_twice == [], actor
    assert actor.trained_once >= MAX_STEPS * BATCH // restarted.config.rl.group_size
    assert actor.dropped["zero_variance"] >= 1, actor
    done = subprocess.run(
        [sys.executable, "-m", "pipelinerl.cli", "runs", "audit", str(restarted.run_dir)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and "skipped" in done.stdout, done.stdout + done.stderr
    handed = [
        json.loads(line) for line in (restarted.run_dir / "prompts" / "actor0.jsonl").read_text().splitlines()
    ]
    attempts = sorted({record["started_at"] for record in handed})
    assert len(attempts) == len(KILLED) + 1, "one hand-out stream per attempt (a new process, or a rebase)"
    actor_log = (restarted.run_dir / "logs" / "actor0.log").read_text()
    for attempt in range(1, len(restarted.resumed) + 1):
        before = read_trained(restarted.checkpoint(attempt))
        again = before.untrained_before(0)
        message = f"resumes at position {before.prompt_positions[0]}, after {len(again)} earlier prompts"
        assert message in actor_log, attempt
        # The next attempt's first hand-outs are exactly those, then the stream after the checkpoint's;
        # the groups an actor that outlived the restart kept are the attempt's too, never handed out again.
        this_attempt = [r for r in handed if r["started_at"] == attempts[attempt]]
        kept = {r["position"] for r in this_attempt if r.get("kept")}
        again_now = [p for p in again if p not in kept]
        stream_from = next(p for p in itertools.count(before.prompt_positions[0]) if p not in kept)
        first = [r["position"] for r in this_attempt if not r.get("kept")][: len(again_now) + 1]
        assert first == [*again_now, stream_from], (attempt, first, again, kept)
        assert not kept & {r["position"] for r in this_attempt if not r.get("kept")}, attempt
    assert any(read_trained(restarted.checkpoint(a)).untrained_before(0) for a in (1, 2, 3)), "no gap to fill"


def test_the_platform_database_holds_the_surviving_versions(restarted):
    """The surviving versions' statistics; the ledger holds exactly their rollouts; the prompt ledger
    gives the audit the run directory gives (``pipelinerl runs audit RUN_ID`` prints the same report)."""
    survivors = {r["policy_version"]: r for r in restarted.records}
    url = database_url(restarted.config)
    with PlatformStore(url) as store:
        detail = store.get_run(restarted.run_id)
        ledger = store.consumed_ids(restarted.run_id)
        prompts = store.prompt_records(restarted.run_id)
    assert [step.version for step in detail.steps] == list(range(1, MAX_STEPS + 1))
    for step in detail.steps:
        assert step.ess == pytest.approx(survivors[step.version]["rl/ess"])
    assert ledger == {rollout_id for r in restarted.records for rollout_id, _ in r["rollouts"]}

    from_database, from_directory = prompts.audit(), audit_run(restarted.run_dir, ranks=1)
    print("prompt audit from the database:", from_database)
    assert from_database == from_directory
    [actor] = from_database.actors
    assert actor.skipped == [] and actor.trained_twice == [] and actor.trained_once > 0, actor
    # A restart keeps the hand-outs: every attempt's, the kept groups re-recorded under the next one.
    assert len({record["started_at"] for record in prompts.handed_out[0]}) == len(KILLED) + 1
    reports = [
        subprocess.run(
            [sys.executable, "-m", "pipelinerl.cli", "runs", "audit", *where],
            capture_output=True,
            text=True,
            timeout=120,
        )
        for where in ([str(restarted.run_dir)], [restarted.run_id, "--url", url])
    ]
    assert [done.returncode for done in reports] == [0, 0], [done.stdout + done.stderr for done in reports]
    assert reports[0].stdout == reports[1].stdout


def test_mlflow_says_each_restart_and_keeps_the_surviving_attempt_last(restarted):
    """The later point of each step is the surviving attempt's; each restart is said."""
    client = mlflow.MlflowClient()
    run = client.get_run((restarted.run_dir / "mlflow_run_id").read_text())
    assert run.info.status == "FINISHED"

    def in_time_order(key: str) -> list[float]:
        history = client.get_metric_history(run.info.run_id, key)
        return [m.value for m in sorted(history, key=lambda m: m.timestamp)]

    assert in_time_order("run/restarts") == [1.0, 2.0, 3.0]
    assert in_time_order("restart/discarded_versions") == [
        float(len(r["discarded_versions"])) for r in restarted.restarts
    ]
    for attempt, resumed in enumerate(restarted.resumed, start=1):
        assert f"resumed from version {resumed}" in run.data.tags[f"pipelinerl.restart.{attempt}"]
    survivors = {r["policy_version"]: r for r in restarted.records}
    latest: dict[int, tuple[int, float]] = {}
    for point in client.get_metric_history(run.info.run_id, "rl/ess"):
        if point.step not in latest or point.timestamp >= latest[point.step][0]:
            latest[point.step] = (point.timestamp, point.value)
    assert sorted(latest) == list(range(1, MAX_STEPS + 1))
    for version, (_, value) in latest.items():
        assert value == pytest.approx(survivors[version]["rl/ess"]), version
