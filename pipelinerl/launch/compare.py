"""``pipelinerl compare``: the same experiment once per mode, as child runs under one parent run.

Every mode gets the same config (seed, data order, batch size, the same processes and threads,
hence the same compute split) except ``run.mode``; the runs go one after another on this machine
so they never share its cores. The parent MLflow run (and a parent row in the platform database)
gets the overlay figure, the comparison table and per-mode metrics; the same table is returned
for printing. The statistics are ``platform/tracking/comparison.py``'s: every run's time to the
target and how many times faster it got there than each baseline (the conventional runs; without
one, the first mode), as the dashboard's comparison table has them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from functools import partial
from typing import Any

from pipelinerl.launch.launcher import RunResult, launch
from pipelinerl.platform.config import MODES, ConfigError, PipelineConfig
from pipelinerl.platform.tracking import figures
from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.tracking.comparison import DEFAULT_WINDOW, ModeRow, compare_runs
from pipelinerl.platform.tracking.parent_run import parent_run
from pipelinerl.platform.tracking.ratios import times_faster_key


@dataclass
class ComparisonResult:
    comparison_id: str
    target: float
    rows: list[ModeRow]
    results: dict[str, RunResult]
    mlflow_run_id: str | None


def parse_modes(text: str) -> list[str]:
    """``"pipeline,conventional"`` -> the modes, checked; at least two, no repeats."""
    modes = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        raise ConfigError(
            f"--modes: {', '.join(map(repr, unknown))} is not a mode; valid: {', '.join(MODES)}"
        )
    if len(modes) < 2 or len(set(modes)) != len(modes):
        raise ConfigError(f"--modes needs two or more different modes, got {text!r}")
    return modes


def label_of(config: PipelineConfig) -> str:
    """The comparison's name for a run (``PipelineConfig.mode_label``)."""
    return config.mode_label()


def mode_config(config: PipelineConfig, mode: str) -> PipelineConfig:
    return config.model_copy(update={"run": config.run.model_copy(update={"mode": mode})})


def run_comparison(
    config: PipelineConfig,
    modes: list[str],
    *,
    target: float | None = None,
    window: int = DEFAULT_WINDOW,
    on_status: Callable[[str], None] | None = None,
    prefect_flow_run_id: str | None = None,
) -> ComparisonResult:
    """Run ``config`` once per mode (in the given order) and compare them (``compare_runs``)."""
    status = on_status or (lambda text: None)
    configs = [mode_config(config, mode) for mode in modes]
    comparison_id = f"{datetime.now():%Y%m%d-%H%M%S}-compare-{uuid.uuid4().hex[:6]}"
    results: dict[str, RunResult] = {}
    with parent_run(
        config, comparison_id, "compare", {"modes": ",".join(modes)}, prefect_flow_run_id
    ) as parent:
        for index, mode_cfg in enumerate(configs, start=1):
            label = label_of(mode_cfg)
            status(f"[{index}/{len(configs)}] {label}")
            results[label] = launch(
                mode_cfg,
                run_id=f"{comparison_id}-{label}",
                on_status=partial(_labelled, status, label),
                on_records=partial(_stepped, status, label, mode_cfg.run.max_steps),
                parent_mlflow_run_id=parent.mlflow_run_id if parent else None,
                parent_run_id=comparison_id if parent else None,
                prefect_flow_run_id=prefect_flow_run_id,
            )
        goal, rows = compare_runs(
            {label: r.records for label, r in results.items()},
            {label: r.summary for label, r in results.items()},
            target=target,
            window=window,
        )
        if parent is not None:
            log_comparison(parent, results, goal, rows, window)
        return ComparisonResult(comparison_id, goal, rows, results, parent.mlflow_run_id if parent else None)


# Per-mode numbers logged on the comparison's parent run as metrics named <label>/<key>; with them
# each run's ratio against each baseline as <label>/times_faster_than_<baseline> (``ratios.py``).
PARENT_METRICS = (
    "time_to_target_s",
    "ess_mean",
    "lag_mean",
    "lag_max",
    "eval_success_end",
)


def log_comparison(
    parent: Any, results: dict[str, RunResult], target: float, rows: list[ModeRow], window: int
) -> None:
    """The overlay figure, the table and per-mode metrics on the parent run."""
    figure = figures.comparison(
        {label: r.records for label, r in results.items()}, title=f"Comparison {parent.run_id}", window=window
    )
    parent.log_figure(figure, "figures/comparison.png")
    metrics: dict[str, float] = {"compare/target_reward": target}
    for row in rows:
        for key in PARENT_METRICS:
            value = getattr(row, key)
            if value is not None:
                metrics[f"{row.label}/{key}"] = float(value)
        for baseline, ratio in row.times_faster_than.items():
            if ratio is not None:
                metrics[times_faster_key(row.label, baseline)] = ratio
    parent.log_table(
        {"target_reward": target, "window": window, "modes": [asdict(row) for row in rows]},
        "comparison.json",
        metrics,
    )


def _stepped(
    status: Callable[[str], None], label: str, steps: int, records: Sequence[dict[str, Any]]
) -> None:
    """A mode's progress as its trainer steps arrive: ``[pipeline] step 12/40, train reward 0.41``."""
    trained = [r for r in records if registry.POLICY_VERSION in r and registry.REWARD_MEAN in r]
    if trained:
        version, reward = trained[-1][registry.POLICY_VERSION], trained[-1][registry.REWARD_MEAN]
        status(f"[{label}] step {version}/{steps}, train reward {reward:.3f}")


def _labelled(status: Callable[[str], None], label: str, text: str) -> None:
    """A mode's status line, prefixed with its label (``[pipeline] ...``)."""
    status(f"[{label}] {text}")
