"""The stage processes of a run (trainer ranks, preprocessor, actors) and their supervision.

A run's stages are split into two **roles**, the unit a cluster places on its nodes:

* ``trainer``: the trainer ranks, and on the role's node 0 the preprocessor that feeds them;
* ``actor``: the actors (one inference engine each).

Each role is spread over ``cluster.<role>_nodes`` nodes (``assignment``). On one machine every stage
of both roles runs here (``LocalStages`` with ``role=None``); on a cluster each node runs its share
(``run_role``, called by the ``rl-role`` Prefect flow on a worker of the role's pool).

Every stage runs in its own process group with its log under ``<run_dir>/logs/``. A stage that
exits before the run is done raises ``StageFailed`` with the tail of its log. Stages get
``PR_SET_PDEATHSIG``, so a launcher killed even by SIGKILL leaves no orphan behind. On a machine
without GPUs the stages of this interpreter are forked from a server that has imported their libraries
once (``run.preload_stages``, ``launch/stage_server.py``); the others start as fresh interpreters.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import psutil

from pipelinerl.launch.gpus import (
    actor_gpu_pool,
    plan_actor_gpus,
    plan_trainer_gpus,
    torch_sees_cuda,
    trainer_device,
    visible_gpus,
)
from pipelinerl.launch.rank_env import torchrun_env
from pipelinerl.launch.stage_server import ForkedProcess, die_with_parent, server_for
from pipelinerl.platform.config import PipelineConfig, Role
from pipelinerl.platform.curve_keys import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE

logger = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 30.0
# Files a stage creates are its user's only (0600, directories 0700): records, checkpoints, tokens.
STAGE_UMASK = 0o077
LOG_TAIL_LINES = 40
POLL_S = 0.5


class StageFailed(RuntimeError):
    """A stage process exited before the run was done; the message carries its log tail, ``stage`` its
    name where one stage is known to have failed."""

    def __init__(self, message: str, stage: str | None = None) -> None:
        super().__init__(message)
        self.stage = stage


def in_trainer_role(stage: str | None) -> bool:
    """A trainer rank or the preprocessor (``stage`` by name; None: no stage known)."""
    return stage is not None and (stage.startswith("trainer") or stage == "preprocessor")


class RunStalled(StageFailed):
    """No optimizer step for ``run.stall_timeout_s`` (the first one: ``run.first_step_timeout_s`` after the
    stages started): the stages are alive but the run makes no progress (a lost message, a peer that
    never answers, a model that never loads); handled as a crash (restart or fail)."""


@dataclass
class StallWatch:
    """When the run last made progress (a new policy version); pure, the caller gives the clock.

    Until the first version after ``start_version`` (where this attempt began: -1 for a new run, the
    checkpoint's version after a restart) the budget is ``first_step_timeout_s`` (loading models and starting
    engines can take minutes), then ``timeout_s`` between versions; 0 turns either off."""

    timeout_s: float
    started: float
    first_step_timeout_s: float = 0.0
    start_version: int = -1
    last_version: int = field(init=False)  # the newest version seen, and when it was first seen
    last_progress: float = field(init=False)

    def __post_init__(self) -> None:
        self.last_version, self.last_progress = self.start_version, self.started

    def observe(self, version: int, now: float) -> None:
        if version > self.last_version:
            self.last_version, self.last_progress = version, now

    @property
    def started_up(self) -> bool:
        return self.last_version > self.start_version

    @property
    def budget_s(self) -> float:
        return self.timeout_s if self.started_up else self.first_step_timeout_s

    def stalled_for(self, now: float) -> float | None:
        """Seconds without progress once past the budget, else None (never with a budget of 0)."""
        idle = now - self.last_progress
        return idle if self.budget_s and idle > self.budget_s else None

    def describe(self, idle_s: float) -> str:
        if self.started_up:
            since, setting = f"policy version {self.last_version}", f"run.stall_timeout_s={self.timeout_s:g}"
        else:
            since, setting = "the stages started", f"run.first_step_timeout_s={self.first_step_timeout_s:g}"
        return (
            f"the run stalled: no optimizer step for {idle_s:.0f} s since {since} "
            f"({setting}); see the stages' logs for what each was waiting on"
        )


@dataclass
class Stage:
    name: str
    command: list[str]
    env: dict[str, str]
    log_path: Path
    cpus: tuple[int, ...] = ()  # CPU cores it is confined to (empty: any)
    preload: bool = False  # forked from a stage server (``python -m MODULE ...`` of this interpreter)
    process: subprocess.Popen[bytes] | ForkedProcess | None = None

    def start(self, cwd: Path) -> None:
        # The log is the run's user's only (it names the stage's streams), as is every file the stage
        # writes (STAGE_UMASK): the run directory is no one else's business.
        self.log_path.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE_MODE)
        os.fchmod(log_fd, PRIVATE_FILE_MODE)  # also a log an earlier attempt of the run left
        cpus = self.cpus
        if self.preload:
            try:
                self.process = self._fork(cwd)
                os.close(log_fd)  # the forked stage opens it for itself
                return
            except (RuntimeError, OSError) as error:  # the stage runs all the same, as a new interpreter
                logger.warning("%s: no stage server (%s); starting a new interpreter", self.name, error)

        def before_exec() -> None:  # only prctl and sched_setaffinity: no locks taken
            die_with_parent()
            if cpus:
                os.sched_setaffinity(0, cpus)

        with os.fdopen(log_fd, "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=before_exec,  # noqa: PLW1509
                umask=STAGE_UMASK,
            )

    def _fork(self, cwd: Path) -> ForkedProcess:
        """The stage forked from this interpreter's stage server (``launch/stage_server.py``)."""
        python, _flag, module, *argv = self.command
        server = server_for(python, self.env)
        return server.spawn(module, argv, self.command, self.env, cwd, self.log_path, self.cpus, STAGE_UMASK)

    @property
    def is_trainer(self) -> bool:
        return self.name.startswith("trainer")

    def exit_code(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def signal_group(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signum)
            except ProcessLookupError:  # a forked stage not yet in its own group: the process alone
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.process.pid, signum)


@dataclass(frozen=True)
class Assignment:
    """Which stages one node of one role runs."""

    trainer_ranks: range
    actor_ids: range
    preprocessor: bool

    def stage_names(self) -> list[str]:
        names = [f"trainer{rank}" for rank in self.trainer_ranks]
        return names + ["preprocessor"] * self.preprocessor + [f"actor{k}" for k in self.actor_ids]


def assignment(config: PipelineConfig, role: Role | None = None, node: int = 0) -> Assignment:
    """The stages of ``role``'s node ``node`` (``role=None``: every stage, on this machine)."""
    ranks, actors = config.trainer.num_processes, config.actor.num_actors
    if role is None:
        return Assignment(range(ranks), range(actors), preprocessor=True)
    nodes = config.cluster.nodes(role)
    if not 0 <= node < nodes:
        raise ValueError(f"node {node} is outside 0..{nodes - 1} (cluster.{role}_nodes={nodes})")
    if role == "trainer":
        per_node = ranks // nodes
        return Assignment(range(node * per_node, (node + 1) * per_node), range(0), preprocessor=node == 0)
    per_node = actors // nodes
    return Assignment(range(0), range(node * per_node, (node + 1) * per_node), preprocessor=False)


def stage_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        PYTHONUNBUFFERED="1",
        DS_ACCELERATOR=env.get("DS_ACCELERATOR", "cpu"),
        TOKENIZERS_PARALLELISM="false",
        # The actor and the preprocessor each build the task's problem list and must agree on every id;
        # some procedural generators draw from sets, whose order follows the string hash seed.
        PYTHONHASHSEED="0",
    )
    return env


def vllm_python() -> Path:
    """The interpreter of the vLLM environment that ``make vllm-env`` builds in this checkout."""
    return Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


def actor_interpreter(config: PipelineConfig) -> str:
    """``actor.python``, else the vLLM environment's for the vllm engine, else this interpreter."""
    if config.actor.python:
        return config.actor.python
    return str(vllm_python()) if config.actor.engine == "vllm" else sys.executable


def build_stages(
    config: PipelineConfig, run_dir: Path, model_path: Path, role: Role | None = None, node: int = 0
) -> list[Stage]:
    """The stage processes (not started) of ``role``'s node ``node``; ``role=None``: all of them."""
    share = assignment(config, role, node)
    python = sys.executable
    logs = run_dir / "logs"
    common = ["--run-dir", str(run_dir)]
    stages = []
    world = config.trainer.num_processes
    # GPUs of this node (launch/gpus.py): the trainer ranks take one each when they run on cuda, the
    # vLLM actors the next ones; a node without GPUs assigns nothing.
    gpus = visible_gpus()
    # Forked from a stage server: this interpreter's stages, on a node without GPUs (stage_server.py).
    preload = config.run.preload_stages and not gpus
    device = (
        trainer_device(config.trainer.device, gpus, bool(gpus) and torch_sees_cuda())
        if share.trainer_ranks
        else "cpu"
    )
    trainer_gpus = plan_trainer_gpus(len(share.trainer_ranks), gpus) if device == "cuda" else []
    for rank in share.trainer_ranks:
        env = stage_env(config.trainer.torch_threads)
        if device == "cuda":  # every rank sees the node's trainer GPUs and takes LOCAL_RANK's
            env.update(CUDA_VISIBLE_DEVICES=",".join(trainer_gpus), DS_ACCELERATOR="cuda")
        # Placed as torchrun places its workers (launch/rank_env.py); the trainer reads RANK.
        env.update(
            torchrun_env(
                rank,
                len(share.trainer_ranks),
                world // len(share.trainer_ranks),  # this node's share of the ranks; 1 node when local
                config.transport.host,
                config.transport.port("trainer_dist"),
            )
        )
        # As torchrun does: a failed NCCL collective aborts the rank instead of hanging the job.
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        command = [python, "-m", "pipelinerl.workers.trainer", *common, "--device", device]
        stages.append(
            Stage(
                f"trainer{rank}",
                [*command, "--model-path", str(model_path)],
                env,
                logs / f"trainer{rank}.log",
                tuple(config.trainer.cpus),
                preload=preload,
            )
        )
    if share.preprocessor:
        stages.append(
            Stage(
                "preprocessor",
                [python, "-m", "pipelinerl.workers.preprocessor", *common],
                stage_env(1),
                logs / "preprocessor.log",
                tuple(config.trainer.cpus),
                preload=preload,
            )
        )
    actor_python = actor_interpreter(config)
    actor_gpus = plan_actor_gpus(
        list(share.actor_ids),
        config.actor.tensor_parallel_size,
        actor_gpu_pool(gpus, trainer_gpus, engine=config.actor.engine, colocate=config.cluster.colocate),
    )
    for actor_id in share.actor_ids:
        command = [actor_python, "-m", "pipelinerl.workers.actor", *common, "--actor-id", str(actor_id)]
        env = stage_env(config.actor.torch_threads)
        if actor_id in actor_gpus:
            env["CUDA_VISIBLE_DEVICES"] = actor_gpus[actor_id]
        stages.append(
            Stage(
                f"actor{actor_id}",
                [*command, "--model-path", str(model_path)],
                env,
                logs / f"actor{actor_id}.log",
                tuple(config.actor.cpus),
                preload=preload and actor_python == python,
            )
        )
    return stages


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants."""
    root = psutil.Process(pid)
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def trainer_finished(run_dir: Path) -> bool:
    """A trainer rank has written its done-marker: it sent Shutdown, so every stage may now exit."""
    return any(run_dir.glob("trainer*.done"))


def check_stages(stages: list[Stage], run_dir: Path) -> bool:
    """True once this set of stages is done; ``StageFailed`` when one exited before its time.

    Done means: every trainer rank here exited 0, or, on a node without trainer ranks, every stage
    exited 0 after a trainer finished. A non-zero exit always fails; a clean exit of a stage other
    than a trainer rank fails too unless a trainer has finished (it was not told to stop).
    """
    trainers = [s for s in stages if s.is_trainer]
    leaders = trainers or stages
    if all(s.exit_code() == 0 for s in leaders) and (trainers or trainer_finished(run_dir)):
        return True
    finishing = trainer_finished(run_dir)
    for stage in stages:
        code = stage.exit_code()
        if code is not None and (code != 0 or not (stage.is_trainer or finishing)):
            raise StageFailed(
                f"stage {stage.name} exited with code {code} before the run ended; "
                f"last lines of {stage.log_path}:\n{stage.log_tail()}",
                stage=stage.name,
            )
    return False


def stop_stages(stages: list[Stage], grace_s: float = SHUTDOWN_GRACE_S) -> None:
    """Let stages exit on their own (they got Shutdown), then SIGTERM, then SIGKILL their groups."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(s.exit_code() is None for s in stages):
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


@runtime_checkable
class RestartsTrainerRole(Protocol):
    """A placement that can restart the trainer role while its actors go on (``platform/rebase.py``)."""

    def stop_trainer_role(self) -> None: ...

    def start_trainer_role(self, config: PipelineConfig, model_path: Path) -> None: ...

    def check_actors(self) -> None: ...


class LocalStages:
    """A placement that runs stages as processes of this machine (all of them, or one role's node)."""

    def __init__(self, run_dir: Path, role: Role | None = None, node: int = 0) -> None:
        self.run_dir = run_dir
        self.role = role
        self.node = node
        self.stages: list[Stage] = []
        self.peak_rss_bytes = 0

    def start(self, config: PipelineConfig, model_path: Path) -> None:
        self.stages = build_stages(config, self.run_dir, model_path, self.role, self.node)
        for stage in self.stages:
            stage.start(cwd=Path.cwd())

    def poll(self) -> bool:
        self.peak_rss_bytes = max(self.peak_rss_bytes, tree_rss_bytes(os.getpid()))
        return check_stages(self.stages, self.run_dir)

    def stop(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        stop_stages(self.stages, grace_s)

    def describe(self) -> str:
        return ", ".join(stage.name for stage in self.stages)

    # The trainer role alone (its ranks and the preprocessor), while the actors go on.

    def stop_trainer_role(self) -> None:
        stop_stages([stage for stage in self.stages if in_trainer_role(stage.name)], grace_s=0)

    def start_trainer_role(self, config: PipelineConfig, model_path: Path) -> None:
        fresh = [
            stage
            for stage in build_stages(config, self.run_dir, model_path, self.role, self.node)
            if in_trainer_role(stage.name)
        ]
        for stage in fresh:
            stage.start(cwd=Path.cwd())
        self.stages = [stage for stage in self.stages if not in_trainer_role(stage.name)] + fresh

    def check_actors(self) -> None:
        """``StageFailed`` if an actor has exited (while the trainer role is down)."""
        check_stages([stage for stage in self.stages if not in_trainer_role(stage.name)], self.run_dir)


def run_role(
    run_dir: Path,
    role: Role,
    node: int,
    model_path: Path,
    stop_requested: Callable[[], str | None] = lambda: None,
) -> str | None:
    """Run one node's share of ``role`` from the run directory's config until it is done.

    What the ``rl-role`` flow runs on a worker of the role's pool: the stages read everything else
    from ``<run_dir>/config.json``; ``StageFailed`` (and so a failed flow run) if one crashes. Each turn
    it asks ``stop_requested``: a reason there (the launcher stopping the run) stops the stages at once
    and is returned; None when the stages finished.
    """
    config = PipelineConfig.model_validate_json((run_dir / "config.json").read_text())
    placement = LocalStages(run_dir, role, node)
    placement.start(config, model_path)
    try:
        while not placement.poll():
            if (reason := stop_requested()) is not None:
                placement.stop(grace_s=0)
                return reason
            time.sleep(POLL_S)
    except BaseException:
        placement.stop(grace_s=0)
        raise
    placement.stop()
    return None
