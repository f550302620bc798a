"""The ``sweep`` flow: a grid (or list) of config overrides, each a child run under one parent run."""

from __future__ import annotations

from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.runtime import flow_run
from pydantic import Field

from pipelinerl.launch.sweep import expand_grid, run_sweep
from pipelinerl.platform.config import ConfigError, PipelineConfig


@flow(name="sweep", log_prints=True)
def sweep(
    config: PipelineConfig = PipelineConfig(),  # noqa: B008 (the form's default)
    grid: dict[str, list[Any]] | None = None,
    points: list[dict[str, Any]] | None = None,
    max_concurrency: Annotated[int, Field(ge=1, le=16)] = 1,
) -> list[dict[str, Any]]:
    """Each combination of ``grid``, or each of ``points``, is a run: child runs of one parent run.

    Args:
        config: The experiment every point starts from.
        grid: Values per setting, every combination a run, e.g. {"rl.batch_size": [16, 32],
            "run.mode": ["pipeline", "conventional"]}. Give this or points, not both.
        points: The runs as a list of overrides, e.g. [{"rl.batch_size": 16},
            {"trainer.learning_rate": 0.0001}]. Give this or grid, not both.
        max_concurrency: Points that run at once (each gets its own block of ports).
    """
    if (grid is None) == (points is None):
        raise ConfigError("give exactly one of grid (values per setting) or points (a list of overrides)")
    overrides = expand_grid(grid) if grid is not None else list(points or [])
    logger = get_run_logger()
    result = run_sweep(
        config,
        overrides,
        max_concurrency=max_concurrency,
        on_status=lambda text: logger.info("%s", text),
        prefect_flow_run_id=str(flow_run.id) if flow_run.id else None,
    )
    rows = [
        {
            "point": point.label,
            "run": result.results[point.label].summary["run_id"],
            "held-out success": round(result.results[point.label].summary["eval_success_end"], 4),
            "ESS mean": round(result.results[point.label].summary["ess_mean"], 4),
            "lag max": result.results[point.label].summary["lag_max"],
        }
        for point in result.points
    ]
    create_table_artifact(key="sweep-table", table=rows, description=f"Sweep {result.sweep_id}")
    return rows
