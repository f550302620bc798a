"""``pipelinerl compare``: the same experiment once per mode, as child runs under one parent run.

Every mode gets the same config (seed, data order, batch size, the same processes and threads,
hence the same compute split) except ``run.mode``; the runs go one after another on this machine
so they never share its cores. The parent MLflow run (and a parent row in the platform database)
gets the overlay figure, the comparison table and per-mode metrics; the same table is returned
for printing. The statistics are ``platform/comparison.py``'s.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelinerl.platform.comparison import DEFAULT_WINDOW, ModeRow, compare_runs
from pipelinerl.platform.config import MODES, ConfigError, PipelineConfig
from pipelinerl.workers.launcher import RunResult, launch


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
    if config.run.mode == "conventional":
        return f"conventional-G{config.run.steps_per_round}"
    if config.run.mode == "async":
        return f"async-lag{config.run.max_lag}"
    return config.run.mode


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
    """Run ``config`` once per mode (in the given order) and compare them; the first is the reference."""
    status = on_status or (lambda text: None)
    configs = [mode_config(config, mode) for mode in modes]
    comparison_id = f"{datetime.now():%Y%m%d-%H%M%S}-compare-{uuid.uuid4().hex[:6]}"
    parent = _Parent(config, comparison_id, modes, prefect_flow_run_id) if config.tracking.enabled else None
    results: dict[str, RunResult] = {}
    outcome = "failed"
    try:
        for index, mode_cfg in enumerate(configs, start=1):
            label = label_of(mode_cfg)
            status(f"[{index}/{len(configs)}] {label}")
            results[label] = launch(
                mode_cfg,
                run_id=f"{comparison_id}-{label}",
                on_status=lambda text, label=label: status(f"[{label}] {text}"),
                parent_mlflow_run_id=parent.mlflow_run_id if parent else None,
                parent_run_id=comparison_id if parent else None,
                prefect_flow_run_id=prefect_flow_run_id,
            )
        reference = label_of(configs[0])
        goal, rows = compare_runs(
            {label: r.records for label, r in results.items()},
            {label: r.summary for label, r in results.items()},
            reference=reference,
            target=target,
            window=window,
        )
        if parent is not None:
            parent.log(results, goal, rows, window)
        outcome = "finished"
        return ComparisonResult(comparison_id, goal, rows, results, parent.mlflow_run_id if parent else None)
    except KeyboardInterrupt:
        outcome = "killed"
        raise
    finally:
        if parent is not None:
            parent.finish(outcome)


class _Parent:
    """The comparison's own MLflow run and platform-database row."""

    def __init__(
        self, config: PipelineConfig, comparison_id: str, modes: list[str], flow_run_id: str | None
    ) -> None:
        from pipelinerl.platform.db import database_url
        from pipelinerl.platform.store import PlatformStore
        from pipelinerl.platform.tracking import MlflowStore, artifact_root, mlflow_uri, param_items

        self.comparison_id = comparison_id
        self.mlflow = MlflowStore(mlflow_uri(config), artifact_root(config))
        tags = {"kind": "comparison", "modes": ",".join(modes), "task": config.task.name}
        if flow_run_id:
            tags["prefect_flow_run_id"] = flow_run_id
        self.mlflow_run_id = self.mlflow.start_run(config.run.name, comparison_id, tags)
        self.mlflow.log_params(
            self.mlflow_run_id, [item for item in param_items(config) if item[0] != "run.mode"]
        )
        self.store = PlatformStore(database_url(config))
        self.store.create_run(
            comparison_id,
            name=config.run.name,
            mode="compare",
            config=config.model_dump(mode="json"),
            started_at=datetime.now(UTC),
            mlflow_run_id=self.mlflow_run_id,
            prefect_flow_run_id=flow_run_id,
        )
        self.summary: dict[str, Any] | None = None

    def log(self, results: dict[str, RunResult], target: float, rows: list[ModeRow], window: int) -> None:
        from pipelinerl.platform import figures
        from pipelinerl.platform.tracking import MetricPoint

        figure = figures.comparison(
            {label: r.records for label, r in results.items()},
            title=f"Comparison {self.comparison_id}",
            window=window,
        )
        self.mlflow.log_figure(self.mlflow_run_id, figure, "figures/comparison.png")
        self.summary = {"target_reward": target, "window": window, "modes": [asdict(row) for row in rows]}
        self.mlflow.log_dict(self.mlflow_run_id, self.summary, "comparison.json")
        now = time.time()
        points = [MetricPoint("compare/target_reward", target, 0, now)]
        for row in rows:
            for key in ("time_to_target_s", "speedup", "ess_mean", "lag_mean", "lag_max", "eval_success_end"):
                value = getattr(row, key)
                if value is not None:
                    points.append(MetricPoint(f"{row.label}/{key}", float(value), 0, now))
        self.mlflow.log_metrics(self.mlflow_run_id, points)

    def finish(self, outcome: str) -> None:
        from pipelinerl.platform.tracking import MLFLOW_STATUS

        self.mlflow.end_run(self.mlflow_run_id, MLFLOW_STATUS[outcome])
        self.store.finish_run(
            self.comparison_id, status=outcome, ended_at=datetime.now(UTC), summary=self.summary
        )


def comparison_dir(result: ComparisonResult) -> Path:
    """Where the child runs are (their common parent directory)."""
    return next(iter(result.results.values())).run_dir.parent
