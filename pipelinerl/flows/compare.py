"""The ``compare`` flow: ``pipelinerl compare`` from Prefect (modes as child runs of one parent run)."""

from __future__ import annotations

from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.runtime import flow_run
from pydantic import Field

from pipelinerl.platform.config import Mode, PipelineConfig


@flow(name="compare", log_prints=True)
def compare(
    config: PipelineConfig = PipelineConfig(),  # noqa: B008 (the form's default)
    modes: Annotated[list[Mode], Field(min_length=2)] = ["pipeline", "conventional"],  # noqa: B006
    target: float | None = None,
    window: Annotated[int, Field(ge=1)] = 5,
) -> list[dict[str, Any]]:
    """Run the experiment once per mode (the first is the reference) and compare them.

    Args:
        config: The experiment every mode runs (run.mode is set per mode).
        modes: Two or more different modes; the first is the reference that the others' times to the
            target are compared with.
        target: The smoothed train reward every mode must reach; empty: the highest that every mode
            reached.
        window: Steps in the trailing mean of the train reward.
    """
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
    reference = result.rows[0].label
    create_table_artifact(
        key="compare-table",
        table=[_rounded(row) for row in rows],
        description=f"Time to a smoothed train reward of {result.target:.3f}; time_vs_reference is each "
        f"run's time to it divided by {reference}'s (2.0: twice as long as {reference}); parent MLflow "
        f"run {result.mlflow_run_id}",
    )
    return rows


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    """The artifact's table: seconds to 0.1 s, ratios and rates to 3 decimals."""
    return {
        key: round(value, 1 if key.endswith("_s") else 3) if isinstance(value, float) else value
        for key, value in row.items()
    }
