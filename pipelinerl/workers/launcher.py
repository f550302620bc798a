"""Launch one run: the three stages as processes on this machine, supervised until the trainer ends.

``launch(config)`` is a plain function (the CLI and, later, the Prefect flows call it):

1. pre-flight, before any process starts: every port the run needs can be bound, the model
   directory exists (or the embedded model is warm-started, cached in the platform home);
2. ``runs/<run-id>/`` gets the resolved ``config.json``; the MLflow run and the platform-database
   row are opened (``platform/tracking.py``); held-out success is measured;
3. trainer rank(s), preprocessor and actor(s) start, each in its own process group with its log
   under ``logs/``; a stage that dies stops the run with the tail of its log;
4. the stages' JSON-lines records (trainer, actors, preprocessor) are tailed and handed to the
   progress view and the tracker, which writes them in batches from its own thread;
5. after the trainer's last step: held-out success of the final policy, ``summary.json``, and the
   tracked run is closed as finished (or failed / killed).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from pipelinerl.platform.checkpoint import CheckpointError, starting_version
from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.jsonl import JsonlTail
from pipelinerl.platform.tracking import CheckpointRecord

POLL_S = 0.5
SHUTDOWN_GRACE_S = 30.0
LOG_TAIL_LINES = 40


class StageFailed(RuntimeError):
    """A stage process exited before the run was done; the message carries its log tail."""


class RunTerminated(BaseException):
    """SIGTERM reached the launcher (a cancelled flow run, ``kill``): the run stops as killed."""


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In a stage process, before exec: get SIGTERM when the launcher dies, even by SIGKILL (Linux)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


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
class Stage:
    name: str
    command: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, cwd: Path) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 (only prctl; no locks taken)
            )

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def signal_group(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signum)


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)


def new_run_id(mode: str) -> str:
    return f"{datetime.now():%Y%m%d-%H%M%S}-{mode}-{uuid.uuid4().hex[:6]}"


def preflight(config: PipelineConfig) -> None:
    """Fail before any process starts: ports in use, unreachable tracking stores, a bad checkpoint."""
    from pipelinerl.platform.transport import check_bindable

    for address in config.transport.all_bound_addresses(config.trainer.num_processes):
        check_bindable(address, setting="transport.base_port")
    if config.tracking.enabled:  # an unreachable store fails now, not after the model is prepared
        from pipelinerl.platform.db import database_url
        from pipelinerl.platform.tracking import check_reachable, mlflow_uri

        check_reachable(mlflow_uri(config))
        check_reachable(database_url(config), "platform database")
    if config.run.resume_from is not None:
        from pipelinerl.platform.checkpoint import read_info

        info = read_info(config.run.resume_from)  # CheckpointError names what is missing
        if info.policy_version >= config.run.max_steps:
            raise CheckpointError(
                f"run.resume_from={str(config.run.resume_from)!r} is at policy version "
                f"{info.policy_version}; run.max_steps={config.run.max_steps} leaves nothing to train "
                "(max_steps counts versions from 0, so raise it)"
            )


def resolve_model(config: PipelineConfig, console: Any = None) -> Path:
    if config.run.resume_from is not None:
        return config.run.resume_from  # checked by preflight: a checkpoint is a model directory
    if config.model.path is not None:
        return config.model.path
    from pipelinerl.workers.warmstart import ensure_warm_start

    cache_dir = config.run.home.expanduser() / "warmstart"
    return ensure_warm_start(
        cache_dir,
        task_name=config.task.name,
        seed=config.run.seed,
        max_steps=config.model.warmstart_max_steps,
        console=console,
    )


def held_out_success(config: PipelineConfig, model_path: Path) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipelinerl.tasks import get_task
    from pipelinerl.workers.warmstart import evaluate_success

    task = get_task(config.task.name)
    problems = task.problems("eval", config.task.eval_problems, config.run.seed)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return evaluate_success(model, tokenizer, task, problems, max_new_tokens=config.actor.max_new_tokens)


def stage_env(config: PipelineConfig, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        PYTHONUNBUFFERED="1",
        DS_ACCELERATOR=env.get("DS_ACCELERATOR", "cpu"),
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def build_stages(config: PipelineConfig, run_dir: Path, model_path: Path) -> list[Stage]:
    python = sys.executable
    logs = run_dir / "logs"
    common = ["--run-dir", str(run_dir)]
    stages = []
    world = config.trainer.num_processes
    for rank in range(world):
        env = stage_env(config, config.trainer.torch_threads)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR=config.transport.host,
            MASTER_PORT=str(config.transport.port("trainer_dist")),
        )
        stages.append(
            Stage(
                f"trainer{rank}",
                [
                    python,
                    "-m",
                    "pipelinerl.workers.trainer",
                    *common,
                    "--rank",
                    str(rank),
                    "--model-path",
                    str(model_path),
                ],
                env,
                logs / f"trainer{rank}.log",
            )
        )
    stages.append(
        Stage(
            "preprocessor",
            [python, "-m", "pipelinerl.workers.preprocessor", *common],
            stage_env(config, 1),
            logs / "preprocessor.log",
        )
    )
    actor_python = config.actor.python or python
    for actor_id in range(config.actor.num_actors):
        stages.append(
            Stage(
                f"actor{actor_id}",
                [
                    actor_python,
                    "-m",
                    "pipelinerl.workers.actor",
                    *common,
                    "--actor-id",
                    str(actor_id),
                    "--model-path",
                    str(model_path),
                ],
                stage_env(config, config.actor.torch_threads),
                logs / f"actor{actor_id}.log",
            )
        )
    return stages


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants."""
    import psutil

    root = psutil.Process(pid)
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


class RecordTails:
    """The JSON-lines files the stages append to, read incrementally (trainer, actors, preprocessor)."""

    def __init__(self, run_dir: Path, num_actors: int) -> None:
        self.trainer = JsonlTail(run_dir / "metrics.jsonl")
        self.actors = [JsonlTail(run_dir / f"actor{k}.jsonl") for k in range(num_actors)]
        self.preprocessor = JsonlTail(run_dir / "preprocessor.jsonl")

    def read(self, sink: RecordSink) -> list[dict[str, Any]]:
        """Hand new records to ``sink``; returns the new trainer records."""
        for tail in self.actors:
            if new := tail.read():
                sink.actor_records(new)
        if new := self.preprocessor.read():
            sink.preprocessor_records(new)
        trainer = self.trainer.read()
        if trainer:
            sink.trainer_records(trainer)
        return trainer


class RecordSink(Protocol):
    def trainer_records(self, records: Sequence[dict[str, Any]]) -> None: ...
    def actor_records(self, records: Sequence[dict[str, Any]]) -> None: ...
    def preprocessor_records(self, records: Sequence[dict[str, Any]]) -> None: ...


@dataclass
class Sinks:
    """Fans records out to every consumer (progress view, tracker); any may be absent."""

    on_trainer: list[Callable[[Sequence[dict[str, Any]]], None]]
    tracker: Any = None  # RunTracker

    def trainer_records(self, records: Sequence[dict[str, Any]]) -> None:
        for callback in self.on_trainer:
            callback(list(records))
        if self.tracker is not None:
            self.tracker.trainer_records(records)
            for record in records:
                if "checkpoint" in record:
                    from pipelinerl.platform.tracking import CheckpointRecord

                    self.tracker.checkpoint(
                        CheckpointRecord(
                            int(record["policy_version"]),
                            int(record["samples/trained"]),
                            record["checkpoint"],
                        )
                    )

    def actor_records(self, records: Sequence[dict[str, Any]]) -> None:
        if self.tracker is not None:
            self.tracker.actor_records(records)

    def preprocessor_records(self, records: Sequence[dict[str, Any]]) -> None:
        if self.tracker is not None:
            self.tracker.preprocessor_records(records)


def supervise(
    stages: list[Stage], run_dir: Path, tails: RecordTails, sink: RecordSink
) -> tuple[list[dict[str, Any]], int]:
    """Wait for the trainers to finish; fail fast if any stage dies first. Returns records, peak RSS."""
    records: list[dict[str, Any]] = []
    peak_rss = 0
    trainers = [s for s in stages if s.name.startswith("trainer")]
    while True:
        records.extend(tails.read(sink))
        peak_rss = max(peak_rss, tree_rss_bytes(os.getpid()))
        if all(s.process and s.process.poll() == 0 for s in trainers):
            records.extend(tails.read(sink))
            return records, peak_rss
        # Once a trainer has written its done-marker it has sent Shutdown: the others may exit.
        finishing = any((run_dir / f"{s.name}.done").exists() for s in trainers)
        for stage in stages:
            code = stage.process.poll() if stage.process else None
            if code is not None and (code != 0 or not (stage in trainers or finishing)):
                raise StageFailed(
                    f"stage {stage.name} exited with code {code} before the run ended; "
                    f"last lines of {stage.log_path}:\n{stage.log_tail()}"
                )
        time.sleep(POLL_S)


def stop_stages(stages: list[Stage], grace_s: float = SHUTDOWN_GRACE_S) -> None:
    """Let stages exit on their own (they got Shutdown), then SIGTERM, then SIGKILL their groups."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(s.process and s.process.poll() is None for s in stages):
        time.sleep(0.2)
    for signum, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        alive = [s for s in stages if s.process and s.process.poll() is None]
        if not alive:
            return
        for stage in alive:
            stage.signal_group(signum)
        for stage in alive:
            with contextlib.suppress(subprocess.TimeoutExpired):
                stage.process.wait(timeout=wait_s)  # type: ignore[union-attr]


def launch(
    config: PipelineConfig,
    *,
    on_records: Callable[[list[dict[str, Any]]], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    run_id: str | None = None,
    parent_mlflow_run_id: str | None = None,
    parent_run_id: str | None = None,
    prefect_flow_run_id: str | None = None,
) -> RunResult:
    """Run PipelineRL (or a baseline, by ``config.run.mode``) end to end; see the module docstring."""
    status = on_status or (lambda text: None)
    preflight(config)
    status("preparing the model")
    model_path = resolve_model(config)
    run_dir = (config.run.output_dir / (run_id or new_run_id(config.run.mode))).resolve()
    run_dir.mkdir(parents=True, exist_ok=False)
    (run_dir / "config.json").write_text(config.model_dump_json(indent=2))
    tracker = None
    if config.tracking.enabled:
        from pipelinerl.platform.tracking import RunTracker

        status("opening the MLflow run")
        tracker = RunTracker(
            config,
            run_dir.name,
            parent_mlflow_run_id=parent_mlflow_run_id,
            parent_run_id=parent_run_id,
            prefect_flow_run_id=prefect_flow_run_id,
        )
        mlflow_run_id = tracker.start(model_path, started_at=time.time())
        (run_dir / "mlflow_run_id").write_text(mlflow_run_id)
    outcome = "failed"
    try:
        with sigterm_stops_the_run():
            result = _run(
                config, run_dir, model_path, status, Sinks([on_records] if on_records else [], tracker)
            )
        outcome = "finished"
        return result
    except BaseException as error:  # Ctrl-C, SIGTERM, a cancelled flow run: killed, not failed
        outcome = "failed" if isinstance(error, Exception) else "killed"
        raise
    finally:
        if tracker is not None:
            summary_path = run_dir / "summary.json"
            summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
            tracker.finish(outcome, summary)


def _run(
    config: PipelineConfig, run_dir: Path, model_path: Path, status: Callable[[str], None], sinks: Sinks
) -> RunResult:
    status("measuring held-out success of the starting policy")
    start_version = starting_version(config.run.resume_from)
    eval_start = held_out_success(config, model_path)
    if sinks.tracker is not None:
        sinks.tracker.evaluated(start_version, eval_start, 0.0)
    stages = build_stages(config, run_dir, model_path)
    status(f"starting {len(stages)} stage processes")
    started = time.time()
    try:
        for stage in stages:
            stage.start(cwd=Path.cwd())
        records, peak_rss = supervise(stages, run_dir, RecordTails(run_dir, config.actor.num_actors), sinks)
    except BaseException:
        # A failed stage, SIGTERM or a cancelled flow run: nobody will send Shutdown, so stop the
        # stages now (a canceller such as Prefect's worker SIGKILLs us 30 s later).
        stop_stages(stages, grace_s=0)
        raise
    stop_stages(stages)  # the trainer sent Shutdown: let the others exit on their own
    run_wall_s = time.time() - started
    status("measuring held-out success of the final policy")
    eval_end = held_out_success(config, run_dir / "final")
    wall_s = records[-1]["wall_s"] if records else run_wall_s
    if sinks.tracker is not None:
        final_version = records[-1]["policy_version"] if records else start_version
        sinks.tracker.evaluated(final_version, eval_end, wall_s)
        sinks.tracker.checkpoint(
            CheckpointRecord(
                final_version, records[-1]["samples/trained"] if records else 0, str(run_dir / "final")
            )
        )
    from pipelinerl.workers.summary import summarize

    summary = summarize(
        records,
        mode=config.run.mode,
        eval_success_start=eval_start,
        eval_success_end=eval_end,
        eval_samples=config.task.eval_problems,
        wall_s=wall_s,
        extra={
            "run_id": run_dir.name,
            "run_wall_s": run_wall_s,
            "peak_memory_gib": peak_rss / 2**30,
            "model_path": str(model_path),
            "start_policy_version": start_version,
        },
    )
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return RunResult(run_dir=run_dir, summary=summary, records=records)
