"""Launch one run: its stages, wherever they are placed, supervised until the trainer ends.

``launch(config)`` is a plain function (the CLI and the Prefect flows call it):

1. pre-flight, before any process starts: every port the run needs can be bound, the tracking
   stores answer, a model or math dataset named by Hugging Face Hub id is resolved once to a local
   snapshot (``platform/hub.py``), the model directory exists (``launch/preflight.py``); the model
   is resolved, the embedded one warm-started and cached in the platform home
   (``launch/model_source.py``);
2. ``runs/<run-id>/`` gets the resolved ``config.json`` (local snapshot paths for loading, the ids,
   revisions and commits in ``model.hub_snapshot``, ``task.hub_snapshot``, ``eval.hub_snapshots``);
   the MLflow run and the platform-database row are opened (``platform/tracking/run_tracker.py``);
   held-out success is measured;
3. the stages start through a **placement**: ``LocalStages`` runs every process on this machine
   (``launch/stages.py``); the ``rl-run`` flow's pool placement submits one Prefect flow run per
   role and node instead (``flows/placement.py``). Either way a crashed stage raises
   ``StageFailed`` with its log tail, and ``run.max_restarts`` lets the run start every stage again
   from its latest checkpoint;
4. the stages' JSON-lines records (trainer, actors, preprocessor) are tailed from the run directory
   and handed to the progress view and the tracker, which writes them in batches from its own thread;
5. after the trainer's last step: held-out success of the final policy, ``summary.json``, and the
   tracked run is closed as finished (or failed / killed).

torch and transformers load inside the functions that use the model, after preflight (a busy port or
a bad path is reported at once); the tracking backends (the platform extra) only for a tracked run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from pipelinerl.launch.model_source import held_out_success, resolve_model
from pipelinerl.launch.preflight import preflight
from pipelinerl.launch.run_prediction import record_prediction
from pipelinerl.launch.run_state import read_held_out_start, write_held_out_start, write_launcher
from pipelinerl.launch.stages import (
    SHUTDOWN_GRACE_S,
    LocalStages,
    RestartsTrainerRole,
    RunStalled,
    StageFailed,
    StallWatch,
    in_trainer_role,
)
from pipelinerl.launch.summary import summarize
from pipelinerl.platform.checkpoint import RunStart, latest_checkpoint, starting_version, write_start
from pipelinerl.platform.config import PipelineConfig, with_overrides
from pipelinerl.platform.curve_keys import PRIVATE_DIR_MODE, create_curve_keys
from pipelinerl.platform.jsonl import JsonlTail
from pipelinerl.platform.prompt_records import dropped_prompts_path, handed_out_path, trainer_dropped_path
from pipelinerl.platform.rebase import Rebase, RebaseAnswer, clear_rebase, read_answers, write_rebase
from pipelinerl.platform.restart_records import discard_after, read_restarts
from pipelinerl.platform.run_phase import write_phase
from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.tracking.mlflow_store import CheckpointRecord

POLL_S = 0.5

__all__ = ["Placement", "RunResult", "RunTerminated", "StageFailed", "launch", "new_run_id"]


class RunTerminated(BaseException):
    """SIGTERM reached the launcher (a cancelled flow run, ``kill``): the run stops as killed."""


@contextlib.contextmanager
def sigterm_stops_the_run() -> Iterator[None]:
    """Turn SIGTERM into ``RunTerminated`` while a run is supervised (main thread, default handler)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) not in (
        signal.SIG_DFL,
        None,
    ):
        yield  # an embedding program (Prefect's engine) handles SIGTERM itself
        return

    def terminate(signum: int, frame: object) -> None:
        raise RunTerminated(f"signal {signum}: stopping every stage")

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)


def new_run_id(mode: str) -> str:
    return f"{datetime.now():%Y%m%d-%H%M%S}-{mode}-{uuid.uuid4().hex[:6]}"


def _recording_phases(status: Callable[[str], None], run_dir: Path) -> Callable[[str], None]:
    """``status``, also writing each phase to the run directory (``platform/run_phase.py``)."""

    def both(text: str) -> None:
        write_phase(run_dir, text)
        status(text)

    return both


def make_private_run_dir(run_dir: Path) -> None:
    """Create ``run_dir`` (new) readable by the run's user only: its logs name the stages' streams and
    its ``keys/`` hold the run's secret keys (the stages' own files are private too: ``stages``)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=False)
    os.chmod(run_dir, PRIVATE_DIR_MODE)  # mkdir's mode passes through the umask; this does not


class RecordTails:
    """The JSON-lines files the stages append to, read incrementally (trainer, actors, preprocessor,
    and the prompt records: each actor's hand-outs, the preprocessor's and each trainer rank's drops).

    After a restart from a checkpoint at version c, ``restart_records.discard_after`` has moved the
    crashed attempt's records of versions after c aside; ``rewind(c)`` goes on from the files as they
    are then, so the versions the next attempt trains again are handed on as what they now are.
    """

    def __init__(self, run_dir: Path, num_actors: int, trainer_ranks: int = 1) -> None:
        self.trainer = JsonlTail(run_dir / "metrics.jsonl")
        self.actors = [JsonlTail(run_dir / f"actor{k}.jsonl") for k in range(num_actors)]
        self.preprocessor = JsonlTail(run_dir / "preprocessor.jsonl")
        self.evals = JsonlTail(run_dir / "eval.jsonl")
        self.handouts = [JsonlTail(handed_out_path(run_dir, k)) for k in range(num_actors)]
        self.drops = [JsonlTail(dropped_prompts_path(run_dir))]
        self.drops += [JsonlTail(trainer_dropped_path(run_dir, rank)) for rank in range(trainer_ranks)]
        self.last_version = -1

    def read(self, sink: RecordSink) -> list[dict[str, Any]]:
        """Hand new records to ``sink``; returns the new trainer records."""
        for tail in self.actors:
            if new := tail.read():
                sink.actor_records(new)
        for actor_id, tail in enumerate(self.handouts):
            if new := tail.read():
                sink.handout_records(actor_id, new)
        for tail in self.drops:
            if new := tail.read():
                sink.drop_records(new)
        if new := self.preprocessor.read():
            sink.preprocessor_records(new)
        if new := self.evals.read():
            sink.eval_records(new)
        trainer = self.trainer.read()
        if trainer:
            self.last_version = trainer[-1]["policy_version"]
            sink.trainer_records(trainer)
        return trainer

    def rewind(self, version: int) -> None:
        """Go on from the end of the files as they are now (no stage running), at policy ``version``.
        The hand-outs read on from where they were: no restart cuts them, and an actor that outlived
        the restart has written its kept groups there since the last read."""
        for tail in (self.trainer, *self.actors, self.preprocessor, self.evals, *self.drops):
            tail.offset = tail.path.stat().st_size if tail.path.exists() else 0
        self.last_version = version


class RecordSink(Protocol):
    def trainer_records(self, records: Sequence[dict[str, Any]]) -> None: ...
    def actor_records(self, records: Sequence[dict[str, Any]]) -> None: ...
    def preprocessor_records(self, records: Sequence[dict[str, Any]]) -> None: ...
    def eval_records(self, records: Sequence[dict[str, Any]]) -> None: ...
    def handout_records(self, actor_id: int, records: Sequence[dict[str, Any]]) -> None: ...
    def drop_records(self, records: Sequence[dict[str, Any]]) -> None: ...


@dataclass
class Sinks:
    """Fans records out to every consumer (progress view, tracker); any may be absent."""

    on_trainer: list[Callable[[Sequence[dict[str, Any]]], None]]
    tracker: Any = None  # RunTracker
    on_eval: list[Callable[[Sequence[dict[str, Any]]], None]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)  # every in-run eval record so far

    @classmethod
    def of(
        cls,
        on_records: Callable[[Sequence[dict[str, Any]]], None] | None,
        tracker: Any,
        on_eval: Callable[[Sequence[dict[str, Any]]], None] | None,
    ) -> Sinks:
        """The sinks of a launch or a resume: its callbacks, where given, and its tracker."""
        return cls([on_records] if on_records else [], tracker, on_eval=[on_eval] if on_eval else [])

    def trainer_records(self, records: Sequence[dict[str, Any]]) -> None:
        for callback in self.on_trainer:
            callback(list(records))
        if self.tracker is not None:
            self.tracker.trainer_records(records)  # checkpoints among them are logged by the tracker

    def actor_records(self, records: Sequence[dict[str, Any]]) -> None:
        if self.tracker is not None:
            self.tracker.actor_records(records)

    def preprocessor_records(self, records: Sequence[dict[str, Any]]) -> None:
        if self.tracker is not None:
            self.tracker.preprocessor_records(records)

    def eval_records(self, records: Sequence[dict[str, Any]]) -> None:
        self.evals.extend(records)
        for callback in self.on_eval:
            callback(list(records))
        if self.tracker is not None:
            self.tracker.eval_records(records)

    def handout_records(self, actor_id: int, records: Sequence[dict[str, Any]]) -> None:
        if self.tracker is not None:
            self.tracker.handout_records(actor_id, records)

    def drop_records(self, records: Sequence[dict[str, Any]]) -> None:
        if self.tracker is not None:
            self.tracker.drop_records(records)


class Placement(Protocol):
    """Where a run's stages execute: started, polled until done, stopped (``launch/stages.py``)."""

    peak_rss_bytes: int

    def start(self, config: PipelineConfig, model_path: Path) -> None: ...

    def poll(self) -> bool:
        """True once the trainer is done; raises ``StageFailed`` when a stage died first."""
        ...

    def stop(self, grace_s: float = SHUTDOWN_GRACE_S) -> None: ...

    def describe(self) -> str: ...


PlacementFactory = Callable[[PipelineConfig, Path], Placement]


def local_placement(config: PipelineConfig, run_dir: Path) -> Placement:
    return LocalStages(run_dir)


@dataclass
class PreparedRun:
    """A run whose directory, tracked run and starting evaluation exist; its stages not yet started."""

    config: PipelineConfig
    run_dir: Path
    model_path: Path
    tracker: Any  # RunTracker | None
    start_version: int
    attempts_before: int = 0  # restarts.jsonl's records before this launcher (a run resumed in place)
    resume_reason: str | None = None  # a run resumed in place (launch/resume.py): why its launcher stopped


def launch(
    config: PipelineConfig,
    *,
    on_records: Callable[[Sequence[dict[str, Any]]], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    on_eval: Callable[[Sequence[dict[str, Any]]], None] | None = None,
    run_id: str | None = None,
    parent_mlflow_run_id: str | None = None,
    parent_run_id: str | None = None,
    prefect_flow_run_id: str | None = None,
    placement: PlacementFactory = local_placement,
) -> RunResult:
    """Run PipelineRL (or a baseline, by ``config.run.mode``) end to end; see the module docstring."""
    status = on_status or (lambda text: None)
    config = preflight(config)  # Hub ids resolved: the stages, config.json and the tracker see local paths
    status("preparing the model")
    model_path = resolve_model(config)
    run_dir = (config.run.output_dir / (run_id or new_run_id(config.run.mode))).resolve()
    make_private_run_dir(run_dir)
    write_launcher(run_dir)  # who runs it: ``pipelinerl resume`` refuses a run whose launcher lives
    status = _recording_phases(status, run_dir)  # the dashboard shows what it does before its first step
    (run_dir / "config.json").write_text(config.model_dump_json(indent=2))
    start = RunStart(model_path=model_path, policy_version=starting_version(config.run.resume_from))
    write_start(run_dir, start)  # what a replay from before the first checkpoint resumes from

    # Every run authenticates its peers, on loopback too (another local process is a stranger); stages
    # on other nodes read the keys from the shared run directory.
    create_curve_keys(run_dir)
    tracker = None
    if config.tracking.enabled:
        from pipelinerl.platform.tracking.run_tracker import RunTracker  # noqa: PLC0415 (SQLAlchemy, matplotlib: only for a tracked run)

        status("opening the MLflow run")
        tracker = RunTracker(
            config,
            run_dir.name,
            parent_mlflow_run_id=parent_mlflow_run_id,
            parent_run_id=parent_run_id,
            prefect_flow_run_id=prefect_flow_run_id,
            run_dir=run_dir,
        )
        mlflow_run_id = tracker.start(model_path, started_at=time.time())
        (run_dir / "mlflow_run_id").write_text(mlflow_run_id)
    prepared = PreparedRun(config, run_dir, model_path, tracker, starting_version(config.run.resume_from))
    return supervise(prepared, placement, status, Sinks.of(on_records, tracker, on_eval))


def supervise(
    prepared: PreparedRun, placement: PlacementFactory, status: Callable[[str], None], sinks: Sinks
) -> RunResult:
    """``run_prepared`` with SIGTERM stopping the run, and the tracked run closed with its outcome."""
    outcome = "failed"
    try:
        with sigterm_stops_the_run():
            result = run_prepared(prepared, placement(prepared.config, prepared.run_dir), status, sinks)
        outcome = "finished"
        return result
    except BaseException as error:  # Ctrl-C, SIGTERM, a cancelled flow run: killed, not failed
        outcome = "failed" if isinstance(error, Exception) else "killed"
        raise
    finally:
        if prepared.tracker is not None:
            summary_path = prepared.run_dir / "summary.json"
            summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
            prepared.tracker.finish(outcome, summary)


def run_prepared(
    prepared: PreparedRun, placement: Placement, status: Callable[[str], None], sinks: Sinks
) -> RunResult:
    """Measure the starting policy (once: a run resumed in place has it on record), train, measure
    the final policy and write the summary."""
    config, run_dir = prepared.config, prepared.run_dir
    eval_start = read_held_out_start(run_dir)
    if eval_start is None:
        status("measuring held-out success of the starting policy")
        eval_start = held_out_success(config, prepared.model_path)
        write_held_out_start(run_dir, eval_start)
        if sinks.tracker is not None:
            sinks.tracker.evaluated(prepared.start_version, eval_start, 0.0)
    started = time.time()
    records, restarts = _train(prepared, placement, status, sinks)
    run_wall_s = time.time() - started
    status("measuring held-out success of the final policy")
    eval_end = held_out_success(config, run_dir / "final")
    wall_s = records[-1]["wall_s"] if records else run_wall_s
    if sinks.tracker is not None:
        final_version = records[-1]["policy_version"] if records else prepared.start_version
        sinks.tracker.evaluated(final_version, eval_end, wall_s)
        sinks.tracker.checkpoint(
            CheckpointRecord(
                final_version, records[-1][registry.SAMPLES_TRAINED] if records else 0, str(run_dir / "final")
            )
        )

    pass_at_1 = registry.name_of(registry.EVAL_PASS_AT, k=1)

    summary = summarize(
        records,
        mode=config.run.mode,
        eval_success_start=eval_start,
        eval_success_end=eval_end,
        eval_samples=config.task.eval_problems,
        wall_s=wall_s,
        extra={
            registry.S_RUN_ID: run_dir.name,
            registry.S_RUN_WALL_S: run_wall_s,
            registry.S_PEAK_MEMORY_GIB: placement.peak_rss_bytes / 2**30,
            registry.S_MODEL_PATH: str(prepared.model_path),
            registry.S_START_POLICY_VERSION: prepared.start_version,
            registry.S_RESTARTS: prepared.attempts_before + restarts,
            # What each restart threw away (restarts.jsonl): versions redone, rollouts discarded and lost.
            registry.S_DISCARDED: read_restarts(run_dir),
            registry.S_PLACEMENT: config.cluster.placement,
            # In-run evaluations through the actor's engine (eval.every), at the versions they measured.
            registry.S_EVAL_IN_RUN: [
                {key: r[key] for key in (registry.POLICY_VERSION, registry.EVAL_SET, pass_at_1)}
                for r in sinks.evals
            ],
        },
    )
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    record_prediction(config, run_dir, sinks.tracker, records)
    return RunResult(run_dir=run_dir, summary=summary, records=records)


def _train(
    prepared: PreparedRun, placement: Placement, status: Callable[[str], None], sinks: Sinks
) -> tuple[list[dict[str, Any]], int]:
    """Start the stages and supervise them until the trainer is done, restarting after a crash
    from the latest checkpoint while ``run.max_restarts`` allows. Returns the records and restarts."""
    config, run_dir, model_path = prepared.config, prepared.run_dir, prepared.model_path
    tails = RecordTails(run_dir, config.actor.num_actors, config.trainer.num_processes)
    records: list[dict[str, Any]] = []
    restarts = 0
    if prepared.resume_reason is not None:  # one more restart of the run, by a new launcher
        config, model_path = restart_point(prepared)
        resumed_from = starting_version(config.run.resume_from)
        discarded = discard_after(
            run_dir,
            resumed_from,
            attempt=prepared.attempts_before,
            reason=prepared.resume_reason,
            sequences_per_batch=config.rl.batch_size // config.trainer.num_processes,
            checkpoint=config.run.resume_from,
        )
        status(f"resumed from {config.run.resume_from or 'the start'}; " + discarded.describe())
        if sinks.tracker is not None:
            sinks.tracker.restarted(prepared.attempts_before, discarded)
    start_all = True  # else the actors outlived a restart of the trainer role, started alone
    while True:
        if start_all:
            clear_rebase(run_dir)  # fresh actors have nothing to rebase
            placement.start(config, model_path)
        status(f"started {placement.describe()}")
        watch = StallWatch(
            config.run.stall_timeout_s,
            time.monotonic(),
            first_step_timeout_s=config.run.first_step_timeout_s,
            start_version=tails.last_version,
        )
        try:
            while not placement.poll():
                records.extend(tails.read(sinks))
                watch.observe(tails.last_version, time.monotonic())
                if (idle_s := watch.stalled_for(time.monotonic())) is not None:
                    raise RunStalled(watch.describe(idle_s))
                time.sleep(POLL_S)
            records.extend(tails.read(sinks))
            break
        except StageFailed as failure:
            survivors = _surviving_actors(config, failure, placement, restarts)
            if survivors is not None:
                survivors.stop_trainer_role()
            else:
                placement.stop(grace_s=0)  # nobody will send Shutdown: stop the others at once
            if restarts >= config.run.max_restarts:
                raise
            restarts += 1
            attempt = prepared.attempts_before + restarts
            records.extend(tails.read(sinks))
            config, model_path = restart_point(prepared)
            first_line = str(failure).splitlines()[0]
            resumed_from = starting_version(config.run.resume_from)
            answers = None
            if survivors is not None:
                status(f"{first_line}; the actors pause for a restart of the trainer role")
                rebase = Rebase(attempt, resumed_from, str(config.run.resume_from or "") or None)
                answers = _actors_paused(survivors, run_dir, rebase, config.actor.num_actors)
                if answers is None:  # an actor died or did not answer: every stage starts again
                    placement.stop(grace_s=0)
            start_all = answers is None
            discarded = discard_after(
                prepared.run_dir,
                resumed_from,
                attempt=attempt,
                reason=first_line,
                sequences_per_batch=config.rl.batch_size // config.trainer.num_processes,
                answers=answers,
                checkpoint=config.run.resume_from,
            )
            records = [r for r in records if r["policy_version"] <= resumed_from]
            sinks.evals[:] = [r for r in sinks.evals if r["policy_version"] <= resumed_from]
            tails.rewind(resumed_from)
            status(
                f"{first_line}; restart {restarts} of {config.run.max_restarts} from "
                f"{'the checkpoint ' + str(model_path) if config.run.resume_from else 'the start'}; "
                + discarded.describe()
            )
            if sinks.tracker is not None:
                sinks.tracker.restarted(attempt, discarded)
            if survivors is not None and not start_all:
                survivors.start_trainer_role(config, model_path)
        except BaseException:
            # SIGTERM or a cancelled flow run: nobody will send Shutdown, so stop the stages now (a
            # canceller such as Prefect's worker SIGKILLs us 30 s later).
            placement.stop(grace_s=0)
            raise
    placement.stop()  # the trainer sent Shutdown: let the others exit on their own
    # What they wrote while exiting (the actors' last hand-outs, the preprocessor's last drops).
    records.extend(tails.read(sinks))
    return records, restarts


# How long the actors have to pause and answer a restart of the trainer role (platform/rebase.py) before
# every stage is restarted instead.
REBASE_ANSWER_TIMEOUT_S = 120.0


def _surviving_actors(
    config: PipelineConfig, failure: StageFailed, placement: Placement, restarts: int
) -> RestartsTrainerRole | None:
    """The placement, where only its trainer role restarts: a restart is left, a trainer rank or the
    preprocessor failed, the run allows it, and the placement can restart one role (the local one and
    the pools' both can). None: every stage restarts, or none."""
    if (
        restarts < config.run.max_restarts
        and config.run.actors_survive_restart
        and in_trainer_role(failure.stage)
        and isinstance(placement, RestartsTrainerRole)
    ):
        return placement
    return None


def _actors_paused(
    placement: RestartsTrainerRole, run_dir: Path, rebase: Rebase, num_actors: int
) -> list[RebaseAnswer] | None:
    """Announce ``rebase`` and wait for every actor's answer; None when one died or did not answer."""
    write_rebase(run_dir, rebase)
    deadline = time.monotonic() + REBASE_ANSWER_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            placement.check_actors()
        except StageFailed:
            clear_rebase(run_dir)
            return None
        answers = read_answers(run_dir, rebase.attempt, num_actors)
        if len(answers) == num_actors:
            return [answers[k] for k in range(num_actors)]
        time.sleep(POLL_S)
    clear_rebase(run_dir)
    return None


def restart_point(prepared: PreparedRun) -> tuple[PipelineConfig, Path]:
    """The config and model every stage starts from again: the run's latest complete checkpoint,
    else where the run started. ``config.json`` is rewritten (stages read it); the first is kept."""
    run_dir = prepared.run_dir
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        config, model_path = prepared.config, prepared.model_path
    else:
        config, model_path = with_overrides(prepared.config, {"run.resume_from": str(checkpoint)}), checkpoint
    initial = run_dir / "config.initial.json"
    if not initial.exists():
        (run_dir / "config.json").rename(initial)
    (run_dir / "config.json").write_text(config.model_dump_json(indent=2))
    for marker in run_dir.glob("trainer*.done"):
        marker.unlink()
    return config, model_path
