"""The rate at which the actor produces rollouts, the transport benchmark's yardstick: from a run
directory's actor records, an engine benchmark's record, or a short engine run measured now."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoTokenizer
from transformers.utils import logging as transformers_logging

from pipelinerl.bench.engine_factories import ENGINES
from pipelinerl.bench.engine_measure import run_continuous
from pipelinerl.bench.engine_workload import EngineBenchSettings, build_workload
from pipelinerl.platform.tracking import metric_registry as registry

if TYPE_CHECKING:
    from rich.progress import Progress


@dataclass(frozen=True)
class ActorRate:
    rollouts_per_s: float
    tokens_per_s: float  # completion tokens
    source: str  # run_dir | engine_json | measured_engine
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "rollouts_per_s": self.rollouts_per_s,
            "tokens_per_s": self.tokens_per_s,
            "source": self.source,
            "detail": self.detail,
        }


def actor_rate_from_run_dir(run_dir: Path) -> ActorRate:
    """The actors' production rate in a finished run: generated tokens over time, per completion length.

    Actor records (``actor<k>.jsonl``, one per loaded update) carry the cumulative
    ``actor/tokens_generated`` and a wall-clock ``time``; the trainer's ``metrics.jsonl`` carries
    the mean completion length of what was trained, which turns tokens/s into rollouts/s.
    """
    actor_files = sorted(run_dir.glob("actor*.jsonl"))
    metrics_path = run_dir / "metrics.jsonl"
    if not actor_files or not metrics_path.is_file():
        raise FileNotFoundError(
            f"{run_dir} has no actor*.jsonl or metrics.jsonl: --run-dir must be a finished run directory "
            "(runs/<run-id>)"
        )
    tokens_per_s = 0.0
    for path in actor_files:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if len(records) < 2:
            raise ValueError(f"{path} has {len(records)} records; need at least 2 to time the actor")
        first, last = records[0], records[-1]
        generated = last[registry.ACTOR_TOKENS_GENERATED] - first[registry.ACTOR_TOKENS_GENERATED]
        tokens_per_s += generated / (last[registry.TIME] - first[registry.TIME])
    steps = [
        registry.canonical_record(json.loads(line), "trainer")  # a run from before the renames too
        for line in metrics_path.read_text().splitlines()
        if line.strip()
    ]
    trained_tokens = sum(step[registry.TRAINER_TOKENS] for step in steps)
    trained_samples = sum(step[registry.TRAINER_SAMPLES] for step in steps)
    if not trained_samples:
        raise ValueError(f"{metrics_path} records no trained samples")
    mean_completion = trained_tokens / trained_samples
    return ActorRate(
        rollouts_per_s=tokens_per_s / mean_completion,
        tokens_per_s=tokens_per_s,
        source="run_dir",
        detail=f"{len(actor_files)} actor record file(s) in {run_dir}: {tokens_per_s:.0f} tokens/s, "
        f"{mean_completion:.1f} completion tokens per trained sample",
    )


def actor_rate_from_engine_json(path: Path) -> ActorRate:
    """The continuous-batching rate an engine benchmark measured (``pipelinerl bench engine``)."""
    if not path.is_file():
        raise FileNotFoundError(
            f"engine benchmark record {str(path)!r} does not exist (pipelinerl bench engine)"
        )
    record = json.loads(path.read_text())
    try:
        sequences_per_s = float(record["continuous_sequences_per_s"])
        tokens_per_s = float(record["continuous_tokens_per_s"])
    except KeyError as error:
        raise ValueError(f"{path} is not an engine benchmark record (no {error.args[0]!r})") from None
    settings = record.get("settings", {})
    return ActorRate(
        rollouts_per_s=sequences_per_s,
        tokens_per_s=tokens_per_s,
        source="engine_json",
        detail=f"{path} ({record.get('timestamp')}, engine {settings.get('engine')}, "
        f"H = {settings.get('in_flight')}, {settings.get('threads')} thread(s), commit "
        f"{str(record.get('git_commit'))[:10]})",
    )


def measure_actor_rate(model_path: Path, threads: int, quick: bool, progress: Progress | None) -> ActorRate:
    """A short continuous-batching run of the transformers engine at the actor's defaults."""
    transformers_logging.disable_progress_bar()
    torch.set_num_threads(threads)
    settings = EngineBenchSettings.quick() if quick else EngineBenchSettings(num_prompts=32)
    workload = build_workload(AutoTokenizer.from_pretrained(model_path), settings)
    engine, _ = ENGINES["transformers"](model_path, workload, settings)
    try:
        task = (
            None
            if progress is None
            else progress.add_task("actor rate: engine run", total=workload.num_sequences)
        )
        stats = run_continuous(
            engine,
            workload,
            settings.in_flight,
            on_progress=None if task is None or progress is None else lambda n: progress.advance(task, n),
        )
    finally:
        engine.close()
    return ActorRate(
        rollouts_per_s=stats.sequences_per_s,
        tokens_per_s=stats.useful_tokens_per_s,
        source="measured_engine",
        detail=f"transformers engine on {model_path}, H = {settings.in_flight}, {workload.num_sequences} "
        f"sequences, {threads} thread(s), measured now",
    )
