"""The ``compare`` flow: ``pipelinerl compare`` from Prefect (modes as child runs of one parent run)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.runtime import flow_run
from pydantic import Field

from pipelinerl.launch.compare import run_comparison
from pipelinerl.platform.config import Mode, PipelineConfig
from pipelinerl.platform.tracking.ratios import TIMES_FASTER_MEANING


@flow(name="compare", log_prints=True)
def compare(
    config: PipelineConfig = PipelineConfig(),  # noqa: B008 (the form's default)
    modes: Annotated[list[Mode], Field(min_length=2)] = ["pipeline", "conventional"],  # noqa: B006
    target: float | None = None,
    window: Annotated[int, Field(ge=1)] = 5,
) -> list[dict[str, Any]]:
    """Run the experiment once per mode and compare them.

    Args:
        config: The experiment every mode runs (run.mode is set per mode).
        modes: Two or more different modes, run in this order; every run's time to the target is
            compared with the conventional run's (without one, the first mode's).
        target: The smoothed train reward every mode must reach; empty: the highest that every mode
            reached.
        window: Steps in the trailing mean of the train reward.
    """
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
        table=[_rounded(_flat(row)) for row in rows],
        description=f"Time to a smoothed train reward of {result.target:.3f}; {TIMES_FASTER_MEANING} "
        f"(column times_faster_than_<B>); parent MLflow run {result.mlflow_run_id}",
    )
    return rows


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """A row with its ``times_faster_than`` mapping as one column per baseline (a table cell each)."""
    flat = {key: value for key, value in row.items() if key != "times_faster_than"}
    return flat | {f"times_faster_than_{b}": ratio for b, ratio in row["times_faster_than"].items()}


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    """The artifact's table: seconds to 0.1 s, ratios and rates to 3 decimals."""
    return {
        key: round(value, 1 if key.endswith("_s") else 3) if isinstance(value, float) else value
        for key, value in row.items()
    }
