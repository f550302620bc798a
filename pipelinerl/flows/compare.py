"""The ``compare`` flow: ``pipelinerl compare`` from Prefect (modes as child runs of one parent run)."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.runtime import flow_run

from pipelinerl.platform.config import Mode, PipelineConfig


@flow(name="compare", log_prints=True)
def compare(
    config: PipelineConfig = PipelineConfig(),  # noqa: B008 (the form's default)
    modes: list[Mode] = ["pipeline", "conventional"],  # noqa: B006 (Prefect copies parameters)
    target: float | None = None,
    window: int = 5,
) -> list[dict[str, Any]]:
    """Run the experiment once per mode (the first is the reference) and compare them."""
    from dataclasses import asdict

    from pipelinerl.launch.compare import run_comparison

    logger = get_run_logger()
    result = run_comparison(
        config,
        list(modes),
        target=target,
        window=window,
        on_status=lambda text: logger.info("%s", text),
        prefect_flow_run_id=str(flow_run.id) if flow_run.id else None,
    )
    rows = [asdict(row) for row in result.rows]
    create_table_artifact(
        key="compare-table",
        table=rows,
        description=f"Time to a smoothed train reward of {result.target:.3f}; parent MLflow run "
        f"{result.mlflow_run_id}",
    )
    return rows
