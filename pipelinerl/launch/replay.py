"""``pipelinerl replay``: train a run's recorded steps again, and check they come out the same.

A run with ``trainer.record_batches`` keeps, per optimizer step, the exact batch each rank trained
(``batches/``), the per-token data it measured (``tokens/``), the digests of the weights it made
(``digests/``) and its metrics line (``metrics.jsonl``), beside its checkpoints and its starting
model (``start.json``). A replay of versions ``--from`` .. ``--to`` resumes the trainer from the
checkpoint at or before ``--from`` (or from the run's start), trains every recorded step from there
to ``--to`` with the trainer's own code (``workers/replay``, one process per recorded rank), and
compares each step with the record (``launch/replay_check``): the token log-probs of its forward pass,
loss, ESS, gradient norm, and the weights, tensor by tensor.

A **what-if** replay changes the recipe (``--set rl.loss=cispo``, ``rl.is_cap``, the learning rate,
``rl.max_lag`` ...: ``WHAT_IF_KEYS``) and trains the same batches under it; its steps are reported
beside the record's, not checked against them. The actors are not replayed: what they sampled is the
data, and a replay never samples.

Everything a replay needs is checked here before any process starts (``plan_replay``): the range
against the recorded steps, every batch record and digest file of the range, the checkpoint, the
changes; ``ReplayError`` names what is wrong.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelinerl.launch.rank_env import torchrun_env
from pipelinerl.launch.stages import stage_env
from pipelinerl.platform.batch_records import batch_record_path
from pipelinerl.platform.bundles import BundleError, Manifest, bundle_start_model, is_bundle, verify_bundle
from pipelinerl.platform.checkpoint import CheckpointError, policy_at_or_before, read_start
from pipelinerl.platform.config import ConfigError, PipelineConfig, parse_override, with_overrides
from pipelinerl.platform.jsonl import step_records
from pipelinerl.platform.ports import free_port
from pipelinerl.platform.step_digests import step_digests_path

REPLAYS_DIR = "replays"

# What a replay can change: how the recorded batches are weighted and stepped, not what they hold
# (the model, the batch, the sampling) nor how many ranks split them.
WHAT_IF_KEYS = frozenset(
    {
        "rl.loss",
        "rl.is_cap",
        "rl.ppo_clip_epsilon",
        "rl.clip_low",
        "rl.clip_high",
        "rl.loss_normalisation",
        "rl.kl.coef",
        "rl.kl.estimator",
        "rl.entropy_coef",
        "rl.max_lag",
        "trainer.learning_rate",
        "trainer.weight_decay",
        "trainer.grad_clip",
    }
)


class ReplayError(ValueError):
    """A replay that cannot be made as asked; the message names the value and what is valid."""


@dataclass(frozen=True)
class ReplayPlan:
    """A replay, checked: resume ``config`` at version ``first`` and train ``first + 1 .. last``."""

    source: Path
    out: Path
    config: PipelineConfig
    model_path: Path
    first: int
    last: int
    asked_from: int
    changes: dict[str, str] = field(default_factory=dict)

    @property
    def what_if(self) -> bool:
        return bool(self.changes)

    @property
    def versions(self) -> range:
        return range(self.first + 1, self.last + 1)


def parse_changes(sets: list[str]) -> dict[str, str]:
    changes: dict[str, str] = {}
    for text in sets:
        path, value = parse_override(text)
        key = ".".join(path)
        if key not in WHAT_IF_KEYS:
            raise ReplayError(
                f"--set {text!r}: a replay cannot change {key!r} (the recorded batches fix the model, the "
                f"batch, the sampling and the ranks); it can change: {', '.join(sorted(WHAT_IF_KEYS))}"
            )
        changes[key] = value
    return changes


def _start_model(source: Path, start_path: Path, model: Path | None) -> tuple[Path | None, Manifest | None]:
    """The run's starting model (None: not here) and, for a bundle, its manifest once verified."""
    if not is_bundle(source):
        path = model or start_path
        return (path if (path / "config.json").is_file() else None), None
    try:
        manifest = verify_bundle(source)
        return bundle_start_model(source, manifest, model), manifest
    except BundleError as error:
        raise ReplayError(str(error)) from None


def plan_replay(
    source: Path,
    first: int | None,
    last: int | None,
    sets: list[str],
    out: Path | None = None,
    model: Path | None = None,
) -> ReplayPlan:
    """The replay of ``source``'s versions ``first`` .. ``last`` (default: all recorded), checked.
    ``source`` is a run directory or a bundle (``platform/bundles``); ``model``, a local copy of the
    model the run started from, where the recorded path does not hold it (a bundle checks its digest)."""
    source = source.expanduser().resolve()
    if not (source / "config.json").is_file():
        raise ReplayError(f"{str(source)!r} is not a run directory or bundle (it has no config.json)")
    try:
        recorded = PipelineConfig.model_validate_json((source / "config.json").read_text())
    except ValueError as error:
        raise ReplayError(f"{str(source / 'config.json')!r} is not a valid run config: {error}") from None
    steps = step_records(source)
    if not steps:
        raise ReplayError(f"{str(source)!r} recorded no optimizer step (metrics.jsonl is empty or missing)")
    try:
        start = read_start(source)
    except CheckpointError as error:
        raise ReplayError(str(error)) from None
    start_model, manifest = _start_model(source, start.model_path, model)
    low, high = (manifest.first, manifest.last) if manifest else (start.policy_version, max(steps))
    last = high if last is None else last
    asked_from = low if first is None else first
    if not low <= asked_from < last <= high:
        raise ReplayError(
            f"--from {asked_from} --to {last}: the {'bundle holds' if manifest else 'run recorded'} "
            f"versions {low + 1}..{high}; a replay goes from a version in {low}..{high - 1} to a later one "
            f"up to {high}"
        )
    model_path, resumed_at, is_checkpoint = policy_at_or_before(source, asked_from)
    changes = parse_changes(sets)
    kl = float(changes.get("rl.kl.coef", recorded.rl.kl.coef)) > 0
    if start_model is None and (not is_checkpoint or kl):
        needs = "it resumes from the run's start" if not is_checkpoint else "its KL term's reference is it"
        raise ReplayError(
            f"the replay needs the model the run started from ({needs}), and {str(start.model_path)!r} holds "
            "none: name a local copy with --model"
        )
    if not is_checkpoint:
        model_path = start_model or model_path
    if not (model_path / "config.json").is_file():
        raise ReplayError(f"the replay resumes from {str(model_path)!r}, which holds no model (config.json)")
    missing = [
        str(path)
        for version in range(resumed_at + 1, last + 1)
        for path in [
            *(batch_record_path(source, version, rank) for rank in range(recorded.trainer.num_processes)),
            step_digests_path(source, version),
        ]
        if not path.is_file()
    ]
    if missing:
        raise ReplayError(
            f"the replay of versions {resumed_at + 1}..{last} needs {len(missing)} file(s) the run does not "
            f"have (was trainer.record_batches off?), e.g. {missing[0]}"
        )
    values: dict[str, Any] = {
        "run.resume_from": str(model_path) if is_checkpoint else None,
        "run.max_steps": max(recorded.run.max_steps, last),
        # The KL term's reference is the run's starting model, also when the replay resumes later.
        "model.path": str(start_model) if start_model is not None else recorded.model.path,
        **changes,
    }
    try:
        config = with_overrides(recorded, values)
    except ConfigError as error:
        raise ReplayError(f"the replay's config is not valid: {error}") from None
    if out is None:
        out = source / REPLAYS_DIR / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    if out.exists() and any(out.iterdir()):
        raise ReplayError(f"--out {str(out)!r} is not empty: a replay writes into a new directory")
    return ReplayPlan(source, out, config, model_path, resumed_at, last, asked_from, changes)


def replay_commands(plan: ReplayPlan, master_port: int) -> list[tuple[list[str], dict[str, str]]]:
    """One (command, environment) per trainer rank, placed as the launcher places a run's ranks."""
    config = plan.config
    ranks = config.trainer.num_processes
    commands = []
    for rank in range(ranks):
        env = stage_env(config.trainer.torch_threads)
        env.update(torchrun_env(rank, ranks, 1, config.transport.host, master_port))
        command = [
            sys.executable,
            "-m",
            "pipelinerl.workers.replay",
            "--source",
            str(plan.source),
            "--out",
            str(plan.out),
            "--model-path",
            str(plan.model_path),
            "--first",
            str(plan.first),
            "--last",
            str(plan.last),
        ]
        commands.append((command, env))
    return commands


def run_replay(plan: ReplayPlan, master_port: int, progress: Callable[[int], None] | None = None) -> None:
    """Train the plan's steps (one process per rank, logs in ``out/logs``); raise naming a rank that failed.
    ``progress`` is told the number of steps replayed so far."""
    plan.out.mkdir(parents=True, exist_ok=True)
    (plan.out / "config.json").write_text(plan.config.model_dump_json(indent=2))
    (plan.out / "replay.json").write_text(
        json.dumps(
            {
                "source": str(plan.source),
                "from": plan.asked_from,
                "resumed_at": plan.first,
                "to": plan.last,
                "model_path": str(plan.model_path),
                "changes": plan.changes,
            },
            indent=2,
        )
    )
    logs = plan.out / "logs"
    logs.mkdir(exist_ok=True)
    processes = []
    for rank, (command, env) in enumerate(replay_commands(plan, master_port)):
        log = (logs / f"replay{rank}.log").open("w")
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        processes.append((rank, process, log))
    try:
        while any(process.poll() is None for _, process, _ in processes):
            failed = [(rank, process) for rank, process, _ in processes if process.poll() not in (None, 0)]
            if failed:
                break
            if progress is not None:
                progress(len(step_records(plan.out)))
            time.sleep(0.5)
        for rank, process, _ in processes:
            if process.poll() not in (None, 0):
                tail = (logs / f"replay{rank}.log").read_text().splitlines()[-15:]
                raise ReplayError(
                    f"replay rank {rank} exited with code {process.returncode}; its log "
                    f"({logs / f'replay{rank}.log'}) ends:\n" + "\n".join(tail)
                )
    finally:
        for _, process, log in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    if progress is not None:
        progress(len(step_records(plan.out)))


def default_master_port(host: str) -> int:
    return int(os.environ.get("PIPELINERL_REPLAY_PORT", 0)) or free_port(host)


def track_what_if(plan: ReplayPlan, started_at: float) -> str | None:
    """A what-if replay as a child of its source run, in MLflow and in the platform database, so the
    dashboard's compare page and MLflow show it beside the run it replays; returns its run id (None:
    a check replay, tracking off, or a source that was never tracked here, such as a bundle)."""
    parent_file = plan.source / "mlflow_run_id"
    if not plan.what_if or not plan.config.tracking.enabled or not parent_file.is_file():
        return None
    from pipelinerl.platform.tracking.db import database_url  # noqa: PLC0415
    from pipelinerl.platform.tracking.run_tracker import RunTracker  # noqa: PLC0415 (MLflow, SQLAlchemy)
    from pipelinerl.platform.tracking.store import PlatformStore  # noqa: PLC0415

    with PlatformStore(database_url(plan.config)) as store:
        try:
            store.get_run(plan.source.name)
            parent_run_id: str | None = plan.source.name
        except LookupError:
            parent_run_id = None  # the source's row is in another database: MLflow still nests it
    run_id = f"{plan.source.name}-replay-{plan.out.name}"
    changes = ", ".join(f"{key}={value}" for key, value in plan.changes.items())
    tracker = RunTracker(
        plan.config,
        run_id,
        parent_mlflow_run_id=parent_file.read_text().strip(),
        parent_run_id=parent_run_id,
        run_dir=plan.out,
        label=f"what-if {changes} (v{plan.first + 1}..{plan.last})",
    )
    tracker.start(plan.model_path, started_at=started_at)
    records = [record for _, record in sorted(step_records(plan.out).items())]
    tracker.trainer_records(records)
    summary = {"steps": len(records), "replay_of": plan.source.name, "changes": plan.changes}
    tracker.finish("finished", summary)
    return run_id
