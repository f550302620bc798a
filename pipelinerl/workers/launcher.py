"""Launch one run: the three stages as processes on this machine, supervised until the trainer ends.

``launch(config)`` is a plain function (the CLI and, later, the Prefect flows call it):

1. pre-flight, before any process starts: every port the run needs can be bound, the model
   directory exists (or the embedded model is warm-started, cached in the platform home);
2. ``runs/<run-id>/`` gets the resolved ``config.json``; held-out success is measured;
3. trainer rank(s), preprocessor and actor(s) start, each in its own process group with its log
   under ``logs/``; a stage that dies stops the run with the tail of its log;
4. progress is read from ``metrics.jsonl`` as the trainer appends it;
5. after the trainer's last step: held-out success of the final policy, ``summary.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pipelinerl.platform.config import PipelineConfig

POLL_S = 0.5
SHUTDOWN_GRACE_S = 30.0
LOG_TAIL_LINES = 40


class StageFailed(RuntimeError):
    """A stage process exited before the run was done; the message carries its log tail."""


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
    """Fail before any process starts: ports in use, a missing model directory."""
    from pipelinerl.platform.transport import check_bindable

    for address in config.transport.all_bound_addresses(config.trainer.num_processes):
        check_bindable(address, setting="transport.base_port")


def resolve_model(config: PipelineConfig, console: Any = None) -> Path:
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


def read_records(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines appended to ``path`` since byte ``offset``."""
    if not path.exists():
        return [], offset
    with path.open("rb") as handle:
        handle.seek(offset)
        data = handle.read()
    end = data.rfind(b"\n") + 1
    lines = data[:end].decode().splitlines()
    return [json.loads(line) for line in lines if line.strip()], offset + end


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


def supervise(
    stages: list[Stage], run_dir: Path, on_records: Callable[[list[dict[str, Any]]], None]
) -> tuple[list[dict[str, Any]], int]:
    """Wait for the trainers to finish; fail fast if any stage dies first. Returns records, peak RSS."""
    records: list[dict[str, Any]] = []
    offset = 0
    peak_rss = 0
    trainers = [s for s in stages if s.name.startswith("trainer")]
    while True:
        new, offset = read_records(run_dir / "metrics.jsonl", offset)
        if new:
            records.extend(new)
            on_records(new)
        peak_rss = max(peak_rss, tree_rss_bytes(os.getpid()))
        if all(s.process and s.process.poll() == 0 for s in trainers):
            new, offset = read_records(run_dir / "metrics.jsonl", offset)
            records.extend(new)
            if new:
                on_records(new)
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
) -> RunResult:
    """Run PipelineRL (or a baseline, by ``config.run.mode``) end to end; see the module docstring."""
    status = on_status or (lambda text: None)
    preflight(config)
    status("preparing the model")
    model_path = resolve_model(config)
    run_dir = (config.run.output_dir / (run_id or new_run_id(config.run.mode))).resolve()
    run_dir.mkdir(parents=True, exist_ok=False)
    (run_dir / "config.json").write_text(config.model_dump_json(indent=2))
    status("measuring held-out success of the starting policy")
    eval_start = held_out_success(config, model_path)
    stages = build_stages(config, run_dir, model_path)
    status(f"starting {len(stages)} stage processes")
    started = time.time()
    try:
        for stage in stages:
            stage.start(cwd=Path.cwd())
        records, peak_rss = supervise(stages, run_dir, on_records or (lambda new: None))
    finally:
        stop_stages(stages)
    run_wall_s = time.time() - started
    status("measuring held-out success of the final policy")
    eval_end = held_out_success(config, run_dir / "final")
    from pipelinerl.workers.summary import summarize

    summary = summarize(
        records,
        mode=config.run.mode,
        eval_success_start=eval_start,
        eval_success_end=eval_end,
        eval_samples=config.task.eval_problems,
        wall_s=records[-1]["wall_s"] if records else run_wall_s,
        extra={
            "run_id": run_dir.name,
            "run_wall_s": run_wall_s,
            "peak_memory_gib": peak_rss / 2**30,
            "model_path": str(model_path),
        },
    )
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return RunResult(run_dir=run_dir, summary=summary, records=records)
