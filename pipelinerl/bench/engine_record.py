"""The engine benchmark's record and table: each engine's figures from its runs, targets, markdown.

Pure: it takes what ``engine.run_engine_bench`` measured and returns the record's parts; it starts
no engine and does no I/O, so it is tested on hand-made runs.

Layout of ``docs/benchmarks/engine.json``:

* top level: the static baseline's figures and the first (reference) engine's, with its targets,
  runs and updates, under the same keys as records of one engine (``bench transport`` reads the
  actor's rate, ``continuous_sequences_per_s``, there);
* ``engines.<name>``: every engine's figures (the first's again), targets, runs and updates. Engines
  after the first add ``compared_with``: their rates over the first engine's neighbouring runs. An
  engine with a second KV-cache policy (vLLM) adds ``kv_cache_recompute``: the same update figures
  with the in-flight sequences' KV cache dropped and recomputed at every update, and its rate over
  the neighbouring ``keep`` run's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from pipelinerl.bench.report import format_value, markdown_table, target_check

if TYPE_CHECKING:
    from pipelinerl.bench.engine import EngineBenchRuns, EngineRuns
    from pipelinerl.bench.engine_measure import GenerationStats

# Issue 5's targets, per engine: continuous batching over static batches of the same size, and the
# share of actor time that in-flight updates take.
CONTINUOUS_OVER_STATIC_AT_LEAST = 1.5
UPDATE_PAUSE_FRACTION_BELOW = 0.01


def paired_ratio(numerators: list[GenerationStats], denominators: list[GenerationStats], rate: str) -> float:
    """Median over repeats of run r's ``rate`` over its neighbour's: a shared machine's load drifts
    between repeats, and neighbours in time see about the same."""
    ratios = [
        getattr(numerator, rate) / getattr(denominator, rate)
        for numerator, denominator in zip(numerators, denominators, strict=True)
        if getattr(denominator, rate)
    ]
    return statistics.median(ratios) if ratios else float("nan")


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def _median_rate(runs: list[GenerationStats], rate: str) -> float:
    return statistics.median(getattr(run, rate) for run in runs) if runs else float("nan")


def static_figures(static_runs: list[GenerationStats]) -> dict[str, float]:
    """The baseline every engine is compared with: ``generate`` on static batches."""
    raw = sum(run.raw_tokens for run in static_runs)
    return {
        "static_useful_tokens_per_s": _median_rate(static_runs, "useful_tokens_per_s"),
        "static_raw_tokens_per_s": _median_rate(static_runs, "raw_tokens_per_s"),
        "static_padding_fraction": 1 - sum(run.useful_tokens for run in static_runs) / max(1, raw),
    }


def update_figures(
    update_runs: list[GenerationStats], without_updates: list[GenerationStats]
) -> dict[str, float]:
    """Pauses and stalls of the updates in ``update_runs``, and their cost against runs without."""
    pauses = [pause for run in update_runs for pause in run.pauses_ms]
    stalls = [stall for run in update_runs for stall in run.stalls_ms]
    wall_s = sum(run.wall_s for run in update_runs)
    return {
        # No update within the runs (an interval longer than a run) measures nothing: NaN, not 0.
        "update_pause_fraction": sum(stalls) / 1000 / wall_s if stalls else float("nan"),
        "update_pause_ms_median": percentile(pauses, 50),
        "update_pause_ms_p99": percentile(pauses, 99),
        "update_stall_ms_median": percentile(stalls, 50),
        "update_stall_ms_p99": percentile(stalls, 99),
        "update_pause_fraction_upper_bound": sum(pauses) / 1000 / wall_s if pauses else float("nan"),
        "tokens_per_s_with_updates_over_without": paired_ratio(
            update_runs, without_updates, "useful_tokens_per_s"
        ),
        "tokens_per_cpu_s_with_updates_over_without": paired_ratio(
            update_runs, without_updates, "useful_tokens_per_cpu_s"
        ),
    }


def update_details(update_runs: list[GenerationStats], runs: EngineBenchRuns) -> dict[str, Any]:
    """Every update's pause and stall, the interval, and (vLLM) the median of each phase."""
    pauses = [pause for run in update_runs for pause in run.pauses_ms]
    stalls = [stall for run in update_runs for stall in run.stalls_ms]
    phases = [phase for run in update_runs for phase in run.phases_ms]
    return {
        "count": len(pauses),
        "interval_s": runs.settings.update_interval_s,
        "interval_source": runs.settings.update_interval_source,
        "wall_s": round(sum(run.wall_s for run in update_runs), 3),
        "pause_ms_mean": float(np.mean(pauses)) if pauses else float("nan"),
        "pause_ms_max": max(pauses, default=float("nan")),
        "stall_ms_mean": float(np.mean(stalls)) if stalls else float("nan"),
        "stall_ms_max": max(stalls, default=float("nan")),
        "pauses_ms": [round(pause, 3) for pause in pauses],
        "stalls_ms": [round(stall, 3) for stall in stalls],
        # vllm: waiting for the step in progress (pause), receive + load (load), relabel + resume,
        # and the receive + load time inside the worker (the rest of "load" is the RPC)
        "phases_ms_median": (
            {name: statistics.median(phase[name] for phase in phases) for name in phases[0]}
            if phases
            else None
        ),
        "parameters_per_update": runs.parameters_per_update,
        "bytes_per_update": runs.bytes_per_update,
    }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def engine_targets(figures: dict[str, float]) -> dict[str, dict[str, Any]]:
    return {
        "continuous_over_static_ratio": target_check(
            _finite(figures["continuous_over_static_ratio"]), at_least=CONTINUOUS_OVER_STATIC_AT_LEAST
        ),
        "update_pause_fraction": target_check(
            _finite(figures["update_pause_fraction"]), below=UPDATE_PAUSE_FRACTION_BELOW
        ),
    }


def engine_figures(engine: EngineRuns, static_runs: list[GenerationStats]) -> dict[str, float]:
    """One engine's headline: its rate, against static batches, and its in-flight updates (keep)."""
    return {
        "continuous_over_static_ratio": paired_ratio(engine.continuous, static_runs, "useful_tokens_per_s"),
        "continuous_over_static_ratio_per_cpu_s": paired_ratio(
            engine.continuous, static_runs, "useful_tokens_per_cpu_s"
        ),
        **update_figures(engine.with_updates["keep"], engine.continuous),
        "continuous_tokens_per_s": _median_rate(engine.continuous, "useful_tokens_per_s"),
        "continuous_sequences_per_s": _median_rate(engine.continuous, "sequences_per_s"),
    }


def engine_block(engine: EngineRuns, runs: EngineBenchRuns) -> dict[str, Any]:
    """Everything the record holds about one engine (see the module docstring)."""
    figures = engine_figures(engine, runs.static)
    block: dict[str, Any] = {**figures, "targets": engine_targets(figures), "version": engine.version}
    reference = runs.engines[0]
    if engine is not reference:
        block["compared_with"] = {
            "engine": reference.name,
            "continuous_tokens_per_s_ratio": paired_ratio(
                engine.continuous, reference.continuous, "useful_tokens_per_s"
            ),
            "continuous_tokens_per_cpu_s_ratio": paired_ratio(
                engine.continuous, reference.continuous, "useful_tokens_per_cpu_s"
            ),
            "tokens_per_s_with_updates_ratio": paired_ratio(
                engine.with_updates["keep"], reference.with_updates["keep"], "useful_tokens_per_s"
            ),
        }
    if "recompute" in engine.with_updates:
        recompute, keep = engine.with_updates["recompute"], engine.with_updates["keep"]
        block["kv_cache_recompute"] = {
            **update_figures(recompute, engine.continuous),
            "tokens_per_s_over_keep": paired_ratio(recompute, keep, "useful_tokens_per_s"),
            "tokens_per_cpu_s_over_keep": paired_ratio(recompute, keep, "useful_tokens_per_cpu_s"),
            "update_runs": [run.summary() for run in recompute],
            "updates": update_details(recompute, runs),
        }
    block["continuous_runs"] = [run.summary() for run in engine.continuous]
    block["update_runs"] = [run.summary() for run in engine.with_updates["keep"]]
    block["updates"] = update_details(engine.with_updates["keep"], runs)
    return block


def summarize(runs: EngineBenchRuns) -> dict[str, Any]:
    """The record's parts: headline (top level), targets, details and notes."""
    blocks = {engine.name: engine_block(engine, runs) for engine in runs.engines}
    reference = blocks[runs.engines[0].name]
    headline = {
        **engine_figures(runs.engines[0], runs.static),
        **static_figures(runs.static),
    }
    workload, settings = runs.workload, runs.settings
    details = {
        "continuous_runs": reference["continuous_runs"],
        "static_runs": [run.summary() for run in runs.static],
        "update_runs": reference["update_runs"],
        "updates": reference["updates"],
        "engines": blocks,
        "workload": {
            "sequences": workload.num_sequences,
            "prompts": settings.num_prompts,
            "group_size": workload.group_size,
            "max_new_tokens": workload.max_new_tokens,
            "max_prompt_tokens": workload.max_prompt_tokens,
            "temperature": workload.temperature,
        },
        "model": {"path": str(runs.model_path), "parameters": runs.parameters_per_update},
    }
    return {"headline": headline, "targets": reference["targets"], "details": details, "notes": _notes(runs)}


def _notes(runs: EngineBenchRuns) -> list[str]:
    settings = runs.settings
    return [
        f"engines: {', '.join(settings.engines)}, all started before the first timed run; each repeat "
        "runs static once, then for each engine in turn continuous and continuous with updates (once "
        "per KV-cache policy). The top level holds the first engine's figures; engines.<name> every "
        "engine's. cpu_s counts this process and its children (vLLM's engine core and worker), "
        "whichever engine runs.",
        "continuous: the engine keeps up to H in flight and refills a whole group of G when there is "
        "room (the actor's policy); tokens/s = completion tokens (EOS included) / time to finish all N.",
        "static: model.generate on consecutive batches of H of the same prompts, same sampling "
        "(temperature, no top-k/top-p), behaviour log-probs computed from the processed scores; "
        "useful tokens stop at each sequence's first EOS, raw tokens include padding.",
        f"updates: one full-state load every {settings.update_interval_s:.3f} s "
        f"({settings.update_interval_source}) while the workload runs again, as in a pipeline run "
        "where the trainer publishes after every optimizer step; vllm receives each over a gloo weight "
        "group from this process (rank 0, the trainer's side). pause = update_weights from the "
        "request to resuming (the actor's weights/update_pause_ms; it includes finishing the current "
        "decode step, whose tokens are not lost); stall = generation stopped to resuming. "
        "update_pause_fraction = sum of stalls / wall time of those runs; "
        "update_pause_fraction_upper_bound uses the pauses instead.",
        "kv_cache_recompute (vllm): the same updates with the in-flight sequences' KV cache cleared "
        "at every pause, so their prefixes are recomputed under the new weights after resuming; "
        "tokens_per_s_over_keep compares it with the neighbouring keep run.",
    ]


# ----- the table -----

Cell = Callable[[dict[str, Any]], Any]  # an engine's block -> the value shown in its column


def _value(*keys: str) -> Cell:
    """The block's value at ``keys`` (nested), or None where the engine has none (shown as —)."""

    def cell(block: dict[str, Any]) -> Any:
        value: Any = block
        for key in keys:
            if not isinstance(value, dict) or value.get(key) is None:
                return None
            value = value[key]
        return value

    return cell


def _median_p99(prefix: str, *within: str) -> Cell:
    def cell(block: dict[str, Any]) -> str | None:
        median, p99 = _value(*within, prefix + "_median")(block), _value(*within, prefix + "_p99")(block)
        return None if median is None else f"{format_value(median)} / {format_value(p99)}"

    return cell


def _with_verdict(key: str) -> Cell:
    def cell(block: dict[str, Any]) -> str:
        verdict = {True: "met", False: "not met", None: "no value"}[block["targets"][key]["met"]]
        return f"{format_value(block[key])} ({verdict})"

    return cell


def _phases(block: dict[str, Any]) -> str | None:
    phases = block["updates"]["phases_ms_median"]
    if not phases:
        return None
    return " / ".join(format_value(phases[name]) for name in ("pause", "load", "label_resume"))


def render_engine_table(record: dict[str, Any]) -> str:
    """Measures as rows, one column per engine (the static baseline is one, shown in each), the target."""
    engines: dict[str, dict[str, Any]] = record["engines"]
    reference = next(iter(engines))
    batch = f"batch {record['settings']['in_flight']}"
    interval = record["updates"]["interval_s"]

    def baseline(key: str) -> Cell:
        return lambda _block: record[key]

    rows: list[tuple[str, Cell, str]] = [
        (
            f"continuous batching, H = {record['settings']['in_flight']} (tokens/s)",
            _value("continuous_tokens_per_s"),
            "",
        ),
        (
            f"the same over the {reference} engine's (neighbouring runs)",
            _value("compared_with", "continuous_tokens_per_s_ratio"),
            "",
        ),
        ("the same per CPU second", _value("compared_with", "continuous_tokens_per_cpu_s_ratio"), ""),
        (f"static `generate`, {batch}: useful tokens/s", baseline("static_useful_tokens_per_s"), ""),
        (f"static `generate`, {batch}: raw tokens/s", baseline("static_raw_tokens_per_s"), ""),
        ("static padding fraction", baseline("static_padding_fraction"), ""),
        (
            "continuous / static (useful tokens/s)",
            _with_verdict("continuous_over_static_ratio"),
            f"≥ {CONTINUOUS_OVER_STATIC_AT_LEAST:g}",
        ),
        (
            "the same per CPU second (this process and its children)",
            _value("continuous_over_static_ratio_per_cpu_s"),
            "",
        ),
        ("in-flight update pause (request to resume), median / p99 (ms)", _median_p99("update_pause_ms"), ""),
        ("generation stalled (stopped to resumed), median / p99 (ms)", _median_p99("update_stall_ms"), ""),
        (
            f"update pause fraction: stalls / actor time (one update per {interval:.2f} s)",
            _with_verdict("update_pause_fraction"),
            f"< {UPDATE_PAUSE_FRACTION_BELOW:g}",
        ),
        ("updates measured", _value("updates", "count"), ""),
        ("the same with whole pauses (upper bound)", _value("update_pause_fraction_upper_bound"), ""),
        ("tokens/s with updates / without", _value("tokens_per_s_with_updates_over_without"), ""),
        ("the same per CPU second", _value("tokens_per_cpu_s_with_updates_over_without"), ""),
        ("update phases, median (ms): step in progress / receive + reload / relabel + resume", _phases, ""),
        (
            "of the receive + reload: inside the worker (ms)",
            _value("updates", "phases_ms_median", "load_in_worker"),
            "",
        ),
        (
            "KV cache recomputed at updates: stall median / p99 (ms)",
            _median_p99("update_stall_ms", "kv_cache_recompute"),
            "",
        ),
        (
            "KV cache recomputed: update pause fraction",
            _value("kv_cache_recompute", "update_pause_fraction"),
            "",
        ),
        (
            "KV cache recomputed: tokens/s with updates / kept-cache updates",
            _value("kv_cache_recompute", "tokens_per_s_over_keep"),
            "",
        ),
    ]
    table = [[label, *(cell(block) for block in engines.values()), target] for label, cell, target in rows]
    # A row no engine has a value for (vLLM's phases with transformers alone) says nothing.
    return markdown_table(
        ["measure", *engines, "target"], [row for row in table if any(v is not None for v in row[1:-1])]
    )
