"""Resuming a run in place after its launcher died: ``pipelinerl resume RUN``.

A launcher that is killed (SIGKILL, an out-of-memory kill, a lost node) takes its stages with it
(``PR_SET_PDEATHSIG``, ``launch/stages.py``) and leaves the run directory as it was: checkpoints, records
and the prompts handed out. ``resume`` goes on with that run (same id, same directory, same MLflow run
and platform-database row, running again) as one more restart of it: from the newest complete
checkpoint, the versions after it set aside (``restart_records.discard_after``: a ``restarts.jsonl``
record whose reason says the launcher stopped), every stage started again, the actors going on with the
checkpoint's prompt stream (the prompts its policy was not trained on handed out again). The prompt
audit (``pipelinerl runs audit``) covers both launchers' attempts.

Refused before anything starts, naming why: not a run directory, a run that finished, a run whose
launcher still lives, stages of the run still running after ``stage_exit_timeout_s``.

The tracker sends the run directory's records to the stores again from the start: the database keeps
each row once; MLflow gets the surviving versions' points again at the same steps, as after a restart.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from pipelinerl.launch.launcher import (
    PlacementFactory,
    PreparedRun,
    RunResult,
    Sinks,
    local_placement,
    supervise,
)
from pipelinerl.launch.model_source import resolve_model
from pipelinerl.launch.preflight import preflight
from pipelinerl.launch.run_state import read_launcher, write_launcher
from pipelinerl.platform.checkpoint import starting_version
from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.restart_records import read_restarts
from pipelinerl.platform.tracking.liveness import liveness_here

STAGE_EXIT_TIMEOUT_S = 30.0  # stages get SIGTERM when their launcher dies; a vLLM engine takes a while


class ResumeRefused(ValueError):
    """A run that cannot be resumed in place; the message says why and what to do."""


def stage_processes(run_dir: Path) -> list[psutil.Process]:
    """This machine's live stage processes of the run in ``run_dir``."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if f"--run-dir {run_dir}" in cmdline and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process)
    return found


def check_resumable(run_dir: Path, stage_exit_timeout_s: float = STAGE_EXIT_TIMEOUT_S) -> None:
    """Raise ``ResumeRefused`` unless ``run_dir`` holds a run that did not finish and that nothing runs."""
    if not (run_dir / "config.json").is_file():
        raise ResumeRefused(f"{str(run_dir)!r} is not a run directory (it has no config.json)")
    launcher = read_launcher(run_dir)
    if launcher is not None and liveness_here(launcher) == "alive":
        raise ResumeRefused(
            f"run {run_dir.name!r} is still running: its launcher, pid {launcher.get('pid')} on this host, "
            "is alive (stop it first: Ctrl-C, or SIGTERM to that pid)"
        )
    if (run_dir / "summary.json").is_file():
        raise ResumeRefused(f"run {run_dir.name!r} finished ({run_dir / 'summary.json'}): nothing to resume")
    deadline = time.monotonic() + stage_exit_timeout_s
    while (left := stage_processes(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        pids = ", ".join(str(process.pid) for process in left)
        raise ResumeRefused(
            f"run {run_dir.name!r} has stages still running (pids {pids}) {stage_exit_timeout_s:.0f} s after "
            "its launcher stopped; stop them first"
        )


def why_it_stopped(run_dir: Path) -> str:
    launcher = read_launcher(run_dir) or {}
    who = f"pid {launcher['pid']} on {launcher.get('host')}" if "pid" in launcher else "its launcher"
    return f"the launcher ({who}) stopped before the run ended; resumed in place by pipelinerl resume"


def resume(
    run_dir: Path,
    *,
    on_records: Callable[[Sequence[dict[str, Any]]], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    on_eval: Callable[[Sequence[dict[str, Any]]], None] | None = None,
    placement: PlacementFactory = local_placement,
    stage_exit_timeout_s: float = STAGE_EXIT_TIMEOUT_S,
) -> RunResult:
    """Go on with the run in ``run_dir`` whose launcher stopped (see the module docstring)."""
    status = on_status or (lambda text: None)
    run_dir = run_dir.resolve()
    check_resumable(run_dir, stage_exit_timeout_s)
    initial = run_dir / "config.initial.json"  # the run's own config (config.json: its last restart's)
    config = PipelineConfig.model_validate_json(
        (initial if initial.is_file() else run_dir / "config.json").read_text()
    )
    config = preflight(config)
    reason = why_it_stopped(run_dir)
    write_launcher(run_dir)
    status("preparing the model")
    model_path = resolve_model(config)
    tracker = None
    mlflow_run_file = run_dir / "mlflow_run_id"
    if config.tracking.enabled and mlflow_run_file.is_file():
        from pipelinerl.platform.tracking.run_tracker import RunTracker  # noqa: PLC0415 (SQLAlchemy, matplotlib: only for a tracked run)

        status("reopening the MLflow run")
        tracker = RunTracker(config, run_dir.name, run_dir=run_dir)
        tracker.reopen(mlflow_run_file.read_text().strip())
    prepared = PreparedRun(
        config,
        run_dir,
        model_path,
        tracker,
        starting_version(config.run.resume_from),
        attempts_before=len(read_restarts(run_dir)) + 1,
        resume_reason=reason,
    )
    return supervise(prepared, placement, status, Sinks.of(on_records, tracker, on_eval))
