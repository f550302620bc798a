"""``pipelinerl bench learning``: how much sooner PipelineRL reaches a held-out success than
conventional RL, on the same task, model, seed, data order, batch size and compute split.

Every variant (PipelineRL, conventional RL with G = 1, 4, 8, the largest G again with strict rounds,
the ``async`` ablation) runs the same config but for ``run.mode`` / ``run.steps_per_round`` /
``run.train_during_round``, one after another (never sharing cores),
each as an MLflow child run under one parent. The **compute split** is fixed by pinning: the actor
gets its own cores (``actor.cpus``) and the trainer and preprocessor theirs (``trainer.cpus``), as
they would own their own GPUs.

Held-out success is measured **after** each run, off its clock, on the checkpoints it wrote every
``--eval-every`` versions (plus the start and the final policy): each point is (wall seconds and
samples trained when the trainer step produced that version, ``comparison.trained_at``; greedy
success on the eval split). The target is the warm-start's success plus ``--target-gain``; a
variant's time to target is the wall time of its first checkpoint at or above it (so its resolution
is the checkpoint spacing). PipelineRL's ratio against a baseline is ``ratios.times_faster``: the
baseline's time ÷ PipelineRL's, under the key ``pipeline/times_faster_than_<baseline>`` (records
before issue 25 call it ``speedup_vs_<baseline>``, same direction).

The paper's figure set (lag against token position, lag histogram, ESS by step, reward against
wall time) is drawn from the first seed's runs of PipelineRL and the largest-G baselines, and the
numbers behind its claims (early against late lag, sequences written by several versions) go into
every variant's row. ``pipelinerl bench figures RUN_DIR...`` draws the same figure again from
finished run directories (``config.json`` + ``metrics.jsonl``), without re-running them.

Pure logic (``success_curve``, ``time_to_target``, ``times_faster_than_baselines``) is separate from
running.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pipelinerl.launch.launcher import launch
from pipelinerl.launch.model_source import held_out_success, resolve_model
from pipelinerl.platform.checkpoint import read_info
from pipelinerl.platform.config import PipelineConfig, with_overrides
from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.tracking.comparison import trained_at_each
from pipelinerl.platform.tracking.figures import early_late_lag, learning_overlay, paper_figures
from pipelinerl.platform.tracking.parent_run import parent_run
from pipelinerl.platform.tracking.ratios import (
    times_faster,
    times_faster_key,
)

BASELINE_GS = (1, 4, 8)
Point = tuple[float, int, float]  # (wall seconds, samples trained, held-out success)


@dataclass(frozen=True)
class Variant:
    label: str  # pipeline, conventional_g1, ..., async
    overrides: dict[str, Any]


def variants(gs: Sequence[int] = BASELINE_GS, with_async: bool = True, strict: bool = True) -> list[Variant]:
    """PipelineRL, conventional RL for each G (training each batch as it fills), the largest G again
    with strict rounds (``strict``: generation, then training, the paper's baseline), and async."""
    found = [Variant("pipeline", {"run.mode": "pipeline"})]
    found += [
        Variant(f"conventional_g{g}", {"run.mode": "conventional", "run.steps_per_round": g}) for g in gs
    ]
    if strict and gs:
        largest = max(gs)
        found.append(
            Variant(
                f"conventional_g{largest}_strict",
                {"run.mode": "conventional", "run.steps_per_round": largest, "run.train_during_round": False},
            )
        )
    if with_async:
        found.append(Variant("async", {"run.mode": "async"}))
    return found


def _prefixed(status: Callable[[str], None], label: str) -> Callable[[str], None]:
    return lambda text: status(f"[{label}] {text}")


def split_cores(available: Iterable[int]) -> tuple[list[int], list[int]]:
    """Half the cores for the actor, the rest for the trainer and preprocessor (one each on 2)."""
    cores = sorted(available)
    if len(cores) < 2:
        return [], []  # nothing to split: unpinned, and the notes say so
    half = len(cores) // 2
    return cores[:half], cores[half:]


def success_curve(
    start_success: float, evaluated: dict[int, float], records: Sequence[dict[str, Any]]
) -> list[Point]:
    """(wall s, samples, success) at version 0 and at each evaluated version after it, in version
    order, each placed where the trainer produced that version (``comparison.trained_at``; a version
    without a trainer record is left out)."""
    versions = sorted(version for version in evaluated if version > 0)
    points: list[Point] = [(0.0, 0, start_success)]
    for version, placed in zip(versions, trained_at_each(versions, records), strict=True):
        if placed is not None:
            points.append((placed.wall_s, placed.samples or 0, evaluated[version]))
    return points


def time_to_target(points: Sequence[Point], target: float) -> float | None:
    """Wall seconds of the first point at or above ``target``; None if none is."""
    return next((wall for wall, _, success in points if success >= target), None)


def times_faster_than_baselines(
    times: dict[str, float | None], run: str = "pipeline"
) -> dict[str, float | None]:
    """How many times faster ``run`` reached the target than every other label
    (``ratios.times_faster``: their time ÷ ``run``'s; None where either is missing)."""
    ours = times.get(run)
    return {
        label: times_faster(run_s=ours, baseline_s=theirs) for label, theirs in times.items() if label != run
    }


@dataclass
class VariantResult:
    label: str
    seed: int
    run_dir: str
    points: list[Point]
    time_to_target_s: float | None
    ess_mean: float
    ess_min: float
    lag_mean: float
    lag_p90: float
    lag_max: int
    actor_idle_fraction: float | None
    trainer_idle_fraction: float
    samples_per_s: float
    tokens_per_s: float
    eval_success_end: float
    wall_s: float
    lag_early: float | None = None  # mean lag over the first quarter of token positions
    lag_late: float | None = None  # ... and over the last quarter
    multi_version_fraction: float = 0.0  # sequences written by two or more policy versions
    # Completion lengths in tokens over the run's steps: mean, median of the steps' p50 and p90, max.
    completion_lengths: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def _actor_idle_fraction(run_dir: Path) -> float | None:
    values = []
    for path in sorted(run_dir.glob("actor*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if registry.ACTOR_IDLE_FRACTION in record:
                values.append(float(record[registry.ACTOR_IDLE_FRACTION]))
    return statistics.fmean(values) if values else None


def evaluate_checkpoints(config: PipelineConfig, run_dir: Path) -> dict[int, float]:
    """Held-out success of every checkpoint the run wrote and of its final policy, by version."""
    directories = sorted((run_dir / "checkpoints").glob("v*")) + [run_dir / "final"]
    found: dict[int, float] = {}
    for directory in directories:
        if (directory / "checkpoint.json").is_file():
            version = read_info(directory).policy_version
            if version not in found:
                found[version] = held_out_success(config, directory)
    return found


def variant_result(
    label: str,
    seed: int,
    config: PipelineConfig,
    result: Any,
    target_gain: float,
    evaluated: dict[int, float],
) -> VariantResult:
    """The run's row; its target is its own start (the seed's warm start on the seed's held-out split,
    the same for every variant of that seed) plus ``target_gain``."""
    records, summary = result.records, result.summary
    points = success_curve(summary["eval_success_start"], evaluated, records)
    target = points[0][2] + target_gain
    wall_s = float(summary["wall_s"]) or 1e-9
    lag_p90 = max((float(r[registry.LAG_P90]) for r in records), default=0.0)
    claims = claim_numbers(records)
    return VariantResult(
        label=label,
        seed=seed,
        run_dir=str(result.run_dir),
        points=points,
        time_to_target_s=time_to_target(points, target),
        ess_mean=float(summary["ess_mean"]),
        ess_min=float(summary["ess_min"]),
        lag_mean=float(summary["lag_mean"]),
        lag_p90=lag_p90,
        lag_max=int(summary["lag_max"]),
        actor_idle_fraction=_actor_idle_fraction(Path(result.run_dir)),
        trainer_idle_fraction=float(summary["trainer_wait_fraction"]),
        samples_per_s=float(summary["samples_trained"]) / wall_s,
        tokens_per_s=float(summary["tokens_per_s"]),
        eval_success_end=float(summary["eval_success_end"]),
        wall_s=float(summary["wall_s"]),
        lag_early=claims["lag_early"],
        lag_late=claims["lag_late"],
        multi_version_fraction=claims["multi_version_fraction"],
        completion_lengths=completion_lengths(records),
    )


def completion_lengths(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The run's completion-length distribution from its per-step records (empty for records written
    before the trainer logged percentiles): mean, the median over steps of each step's p50 and p90, max.
    Records written before the metric renames are read under the new names."""
    named = (registry.canonical_record(r, "trainer") for r in records)
    steps = [r for r in named if registry.COMPLETION_LEN_P90 in r]
    if not steps:
        return {}
    return {
        "mean": statistics.fmean(float(r[registry.COMPLETION_LEN_MEAN]) for r in steps),
        "p50": statistics.median(float(r[registry.COMPLETION_LEN_P50]) for r in steps),
        "p90": statistics.median(float(r[registry.COMPLETION_LEN_P90]) for r in steps),
        "max": float(max(int(r[registry.COMPLETION_LEN_MAX]) for r in steps)),
    }


def claim_numbers(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The numbers behind the paper's claims, from a run's per-step records: mean lag over the first
    and the last quarter of token positions, the fraction of sequences written by two or more policy
    versions, ESS mean and minimum over steps, and the largest token lag (records written before the
    metric renames are read under the new names)."""
    records = [registry.canonical_record(r, "trainer") for r in records]
    lag_early, lag_late = early_late_lag(records)
    samples = sum(int(r[registry.TRAINER_SAMPLES]) for r in records)
    multi_version = sum(int(r[registry.TRAINER_INFLIGHT_SEQUENCES]) for r in records)
    return {
        "lag_early": lag_early,
        "lag_late": lag_late,
        "multi_version_fraction": multi_version / max(samples, 1),
        "ess_mean": statistics.fmean(float(r[registry.ESS]) for r in records) if records else None,
        "ess_min": min((float(r[registry.ESS]) for r in records), default=None),
        "lag_max": max((int(r[registry.LAG_MAX]) for r in records), default=None),
    }


def run_learning_bench(
    base: PipelineConfig,
    *,
    chosen: Sequence[Variant],
    seeds: Sequence[int],
    target_gain: float,
    eval_every: int,
    pin: bool = True,
    paper_figure: Path | None = None,
    on_status: Callable[[str], None] | None = None,
    reference: str = "pipeline",
    name: str = "bench-learning",
) -> dict[str, Any]:
    """Run every variant for every seed, evaluate their checkpoints, and compare them with the
    ``reference`` variant; the paper's figure set goes to ``paper_figure`` (PNG) when given."""
    status = on_status or (lambda text: None)
    actor_cpus, trainer_cpus = split_cores(os.sched_getaffinity(0)) if pin else ([], [])
    common = {
        "trainer.checkpoint_every": eval_every,
        "actor.cpus": actor_cpus,
        "trainer.cpus": trainer_cpus,
    }
    base = with_overrides(base, common)
    bench_id = f"{datetime.now():%Y%m%d-%H%M%S}-{name}-{uuid.uuid4().hex[:6]}"
    resolve_model(base)  # the first seed's warm start, trained (once) before any run is timed
    tags = {"variants": ",".join(v.label for v in chosen)}
    with parent_run(base, bench_id, name, tags) as parent:
        results: list[VariantResult] = []
        first_seed_records: dict[str, list[dict[str, Any]]] = {}
        for seed in seeds:
            for index, variant in enumerate(chosen, start=1):
                config = with_overrides(base, {**variant.overrides, "run.seed": seed})
                status(f"[seed {seed}, {index}/{len(chosen)}] {variant.label}")
                run = launch(
                    config,
                    run_id=f"{bench_id}-{variant.label}-s{seed}",
                    on_status=_prefixed(status, variant.label),
                    parent_mlflow_run_id=parent.mlflow_run_id if parent else None,
                    parent_run_id=bench_id if parent else None,
                )
                status(f"[{variant.label}] evaluating its checkpoints on the held-out split")
                evaluated = evaluate_checkpoints(config, run.run_dir)
                results.append(variant_result(variant.label, seed, config, run, target_gain, evaluated))
                if seed == seeds[0]:
                    first_seed_records[variant.label] = run.records
        report = summarize_bench(results, target_gain, [v.label for v in chosen], reference)
        report["details"]["settings"] = {
            "actor_cpus": actor_cpus,
            "trainer_cpus": trainer_cpus,
            "eval_every": eval_every,
            "eval_problems": base.task.eval_problems,
            "batch_size": base.rl.batch_size,
            "max_steps": base.run.max_steps,
            "max_in_flight": base.actor.max_in_flight,
            "seeds": list(seeds),
            "bench_id": bench_id,
            "mlflow_parent_run_id": parent.mlflow_run_id if parent else None,
        }
        paper = paper_figure_runs(first_seed_records)
        if paper_figure is not None and paper:
            save_paper_figures(paper, paper_figure, seeds[0])
            report["details"]["paper_figure"] = str(paper_figure)
        if parent is not None:
            parent.log_figure(
                learning_overlay(curves_by_label(results), report["headline"]["target_success"]),
                "figures/learning.png",
            )
            if paper:
                parent.log_figure(paper_figures(paper), "figures/paper.png")
            parent.log_table(report, "learning.json", _numeric(report["headline"]))
        return report


def paper_figure_runs(records_by_label: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """The runs the paper's figures compare: PipelineRL and the largest-G conventional baselines
    (as trained during the round and with strict rounds), under readable labels."""
    conventional = [label for label in records_by_label if label.startswith("conventional_g")]
    largest = max((int(label.split("_")[1][1:]) for label in conventional), default=None)
    labels = ["pipeline"]
    if largest is not None:
        labels += [f"conventional_g{largest}", f"conventional_g{largest}_strict"]
    return {readable_label(label): records_by_label[label] for label in labels if label in records_by_label}


def variant_label(run_config: dict[str, Any]) -> str:
    """The bench's label of a run from its ``config.json``: ``pipeline``, ``async``,
    ``conventional_g<G>`` or, with strict rounds, ``conventional_g<G>_strict``."""
    run = run_config["run"]
    if run["mode"] != "conventional":
        return str(run["mode"])
    label = f"conventional_g{run['steps_per_round']}"
    return label if run.get("train_during_round", True) else f"{label}_strict"


def readable_label(label: str) -> str:
    """``conventional_g8_strict`` -> ``conventional G=8, strict rounds``; ``pipeline`` -> ``PipelineRL``."""
    if label == "pipeline":
        return "PipelineRL"
    if label.startswith("conventional_g"):
        g, _, strict = label.removeprefix("conventional_g").partition("_")
        return f"conventional G={g}" + (", strict rounds" if strict == "strict" else "")
    return label


def read_run_dir(run_dir: Path) -> tuple[str, int, list[dict[str, Any]]]:
    """A finished run's bench label, seed and per-step records (its ``config.json`` and
    ``metrics.jsonl``)."""
    config_path, metrics_path = run_dir / "config.json", run_dir / "metrics.jsonl"
    for path in (config_path, metrics_path):
        if not path.is_file():
            raise ValueError(f"{run_dir} has no {path.name}: give finished run directories (runs/<run-id>)")
    run_config = json.loads(config_path.read_text())
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    if not records:
        raise ValueError(f"{metrics_path} has no step records: the run trained no step")
    return variant_label(run_config), int(run_config["run"]["seed"]), records


def redraw_paper_figures(run_dirs: Sequence[Path], path: Path) -> dict[str, dict[str, Any]]:
    """The paper's figure set drawn again from finished runs (one per variant), saved to ``path``;
    returns each run's claim numbers by readable label."""
    runs: dict[str, list[dict[str, Any]]] = {}
    sources: dict[str, Path] = {}
    seeds: set[int] = set()
    for run_dir in run_dirs:
        label, seed, records = read_run_dir(run_dir)
        name = readable_label(label)
        if name in runs:
            raise ValueError(f"{sources[name]} and {run_dir} are both {label}: give one run per variant")
        runs[name], sources[name] = records, run_dir
        seeds.add(seed)
    save_paper_figures(runs, path, seeds.pop() if len(seeds) == 1 else None)
    return {name: claim_numbers(records) for name, records in runs.items()}


def save_paper_figures(runs: dict[str, list[dict[str, Any]]], path: Path, seed: int | None) -> Path:
    title = "The paper's figures on this machine" + (f" (seed {seed})" if seed is not None else "")
    figure = paper_figures(runs, title=title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


def save_overlay(
    record: dict[str, Any], path: Path, title: str = "Held-out success: PipelineRL vs baselines"
) -> Path:
    """The overlay figure of a ``learning.json`` record, as a PNG beside it (``docs/benchmarks/``)."""
    curves: dict[str, list[list[Point]]] = {}
    for run in record["runs"]:
        curves.setdefault(run["label"], []).append([tuple(point) for point in run["points"]])  # type: ignore[misc]
    figure = learning_overlay(curves, record["target_success"], title=title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


def curves_by_label(results: Sequence[VariantResult]) -> dict[str, list[list[Point]]]:
    curves: dict[str, list[list[Point]]] = {}
    for result in results:
        curves.setdefault(result.label, []).append(result.points)
    return curves


def _numeric(values: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present and len(present) == len(values) else None


def summarize_bench(
    results: Sequence[VariantResult], target_gain: float, labels: Sequence[str], reference: str = "pipeline"
) -> dict[str, Any]:
    """Headline numbers and the per-variant table; pure.

    Each seed has its own warm start and held-out split, so its own start and target (start plus
    ``target_gain``). PipelineRL's ratio against a baseline (``pipeline/times_faster_than_<label>``)
    is the median over seeds of that seed's ``times_faster`` (the baseline's time to target ÷
    PipelineRL's), given with every seed's ratio (``…_per_seed``); undefined (None) when a seed's run
    did not reach its target, rather than a median of the lucky seeds. The PipelineRL row carries the
    same as ``times_faster_than`` / ``times_faster_than_per_seed``, by baseline.
    """
    by_label = {label: [r for r in results if r.label == label] for label in labels}
    times = {label: _median([r.time_to_target_s for r in rs]) for label, rs in by_label.items()}
    starts = {r.seed: r.points[0][2] for r in results if r.points}
    by_seed = {
        seed: times_faster_than_baselines(
            {r.label: r.time_to_target_s for r in results if r.seed == seed}, reference
        )
        for seed in {r.seed for r in results}
    }
    per_seed = {
        label: [by_seed[r.seed].get(label) for r in rs]
        for label, rs in by_label.items()
        if label != reference
    }
    headline: dict[str, Any] = {
        "target_gain": target_gain,
        "start_success_by_seed": {str(seed): start for seed, start in sorted(starts.items())},
        "target_success_by_seed": {str(seed): start + target_gain for seed, start in sorted(starts.items())},
        # The overlay's target line: the first seed's.
        "target_success": next(iter(sorted(starts.items())), (0, 0.0))[1] + target_gain,
        **{times_faster_key(reference, label): _median(ratios) for label, ratios in per_seed.items()},
        **{f"{times_faster_key(reference, label)}_per_seed": ratios for label, ratios in per_seed.items()},
        **{f"ess_mean_{label}": statistics.fmean(r.ess_mean for r in rs) for label, rs in by_label.items()},
        **{f"time_to_target_s_{label}": t for label, t in times.items()},
    }
    medians = {label: headline[times_faster_key(reference, label)] for label in per_seed}
    rows = []
    for label, rs in by_label.items():
        rows.append(
            {
                "variant": label,
                "time_to_target_s": times[label],
                "time_to_target_s_per_seed": [r.time_to_target_s for r in rs],
                **(
                    {"times_faster_than": medians, "times_faster_than_per_seed": per_seed}
                    if label == reference
                    else {}
                ),
                "eval_success_end": statistics.fmean(r.eval_success_end for r in rs),
                "ess_mean": statistics.fmean(r.ess_mean for r in rs),
                "ess_min": min(r.ess_min for r in rs),
                "lag_mean": statistics.fmean(r.lag_mean for r in rs),
                "lag_p90": max(r.lag_p90 for r in rs),
                "lag_max": max(r.lag_max for r in rs),
                "actor_idle_fraction": _mean_or_none([r.actor_idle_fraction for r in rs]),
                "trainer_idle_fraction": statistics.fmean(r.trainer_idle_fraction for r in rs),
                "samples_per_s": statistics.fmean(r.samples_per_s for r in rs),
                "tokens_per_s": statistics.fmean(r.tokens_per_s for r in rs),
                "wall_s": statistics.fmean(r.wall_s for r in rs),
                "lag_early": _mean_or_none([r.lag_early for r in rs]),
                "lag_late": _mean_or_none([r.lag_late for r in rs]),
                "multi_version_fraction": statistics.fmean(r.multi_version_fraction for r in rs),
                "completion_lengths": rs[0].completion_lengths if len(rs) == 1 else _merged_lengths(rs),
            }
        )
    return {
        "headline": headline,
        "details": {"variants": rows, "runs": [asdict(r) for r in results]},
        "notes": [],
    }


def results_from_record(record: dict[str, Any]) -> list[VariantResult]:
    """The runs of a ``learning.json`` record as results again (``bench learning --from-record``
    summarises measured runs anew, e.g. with another target gain, without running them again)."""
    fields = {f.name for f in dataclasses.fields(VariantResult)}
    results = []
    for run in record["runs"]:
        result = VariantResult(**{key: value for key, value in run.items() if key in fields})
        result.points = [tuple(point) for point in result.points]  # type: ignore[misc]
        results.append(result)
    return results


def retarget(results: Sequence[VariantResult], target_gain: float) -> list[VariantResult]:
    """``results`` with each run's time to its seed's start plus ``target_gain``."""
    return [
        dataclasses.replace(r, time_to_target_s=time_to_target(r.points, r.points[0][2] + target_gain))
        for r in results
    ]


def _merged_lengths(results: Sequence[VariantResult]) -> dict[str, float]:
    """Seeds' completion-length summaries together: mean and percentiles averaged, the largest max."""
    present = [r.completion_lengths for r in results if r.completion_lengths]
    if not present:
        return {}
    merged = {key: statistics.fmean(lengths[key] for lengths in present) for key in ("mean", "p50", "p90")}
    return {**merged, "max": max(lengths["max"] for lengths in present)}


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None
