"""``pipelinerl bench recipes``: the training recipes (docs/recipes.md) on the same task, in PipelineRL
mode, seed by seed: held-out success over time, ESS and lag (``bench learning``'s runs and summary, with
``truncated_is``, the paper's loss, as the reference), and what each recipe did to the off-policy
tokens: the shares of tokens whose weight hit a bound, the KL to the reference, the step time (a KL
term loads a frozen reference model: its cost shows there).

The pure part (``recipe_variants``, ``recipe_figures``) is unit-tested; the runs are real.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipelinerl.bench.learning import Variant
from pipelinerl.platform.tracking import metric_registry as registry

REFERENCE = "truncated_is"
# Each recipe as the settings that make it, in PipelineRL mode (the mode whose lag makes them differ).
RECIPES: dict[str, dict[str, Any]] = {
    REFERENCE: {"rl.loss": "truncated_is"},
    "ppo_clip_higher_token": {
        "rl.loss": "ppo_clip",
        "rl.clip_low": 0.2,
        "rl.clip_high": 0.28,
        "rl.loss_normalisation": "token",
    },
    "gspo": {"rl.loss": "gspo"},
    "cispo": {"rl.loss": "cispo"},
    "truncated_is_kl": {"rl.loss": "truncated_is", "rl.kl.coef": 0.05, "rl.kl.estimator": "k3"},
}


def recipe_variants(names: Sequence[str]) -> list[Variant]:
    """The recipes ``names`` (the reference first, whether named or not) as bench variants."""
    unknown = [name for name in names if name not in RECIPES]
    if unknown:
        raise ValueError(f"unknown recipe(s) {', '.join(unknown)}; valid: {', '.join(RECIPES)}")
    ordered = [REFERENCE, *(name for name in names if name != REFERENCE)]
    return [Variant(name, {"run.mode": "pipeline", **RECIPES[name]}) for name in ordered]


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def recipe_figures(records: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """One run's recipe figures from its trainer records: means over its steps."""
    records = [registry.canonical_record(record, "trainer") for record in records]

    def mean_of(key: str) -> float | None:
        return _mean([float(record[key]) for record in records if key in record])

    return {
        "clipped_fraction": mean_of(registry.CLIPPED_FRACTION),
        "clipped_low_fraction": mean_of(registry.CLIPPED_LOW_FRACTION),
        "clipped_high_fraction": mean_of(registry.CLIPPED_HIGH_FRACTION),
        "kl_mean": mean_of(registry.KL_MEAN),
        "step_s": mean_of(registry.TRAINER_STEP_S),
    }


def add_recipe_figures(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` (``bench learning``'s summary) with each run's and each variant's recipe figures."""
    runs = report["details"]["runs"]
    for run in runs:
        lines = (Path(run["run_dir"]) / "metrics.jsonl").read_text().splitlines()
        run["extra"] = {**run.get("extra", {}), **recipe_figures([json.loads(line) for line in lines])}
    for row in report["details"]["variants"]:
        mine = [run["extra"] for run in runs if run["label"] == row["variant"]]
        for key in ("clipped_fraction", "clipped_low_fraction", "clipped_high_fraction", "kl_mean", "step_s"):
            row[key] = _mean([extra[key] for extra in mine if extra.get(key) is not None])
    return report


TABLE_HEADERS = (
    "recipe",
    "final success",
    "time to target (s)",
    "ESS mean",
    "ESS min",
    "lag mean",
    "tokens clipped (low / high)",
    "KL mean",
    "step s",
    "samples/s",
)


def table_rows(record: dict[str, Any]) -> list[list[Any]]:
    def pair(row: dict[str, Any]) -> str:
        low, high = row.get("clipped_low_fraction"), row.get("clipped_high_fraction")
        return "—" if low is None or high is None else f"{low:.3f} / {high:.3f}"

    return [
        [
            row["variant"],
            row["eval_success_end"],
            row["time_to_target_s"],
            row["ess_mean"],
            row["ess_min"],
            row["lag_mean"],
            pair(row),
            row.get("kl_mean"),
            row.get("step_s"),
            row["samples_per_s"],
        ]
        for row in record["variants"]
    ]
