"""The parent run that groups child runs (a comparison, a sweep) in MLflow and the platform database."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.tracking.db import database_url
from pipelinerl.platform.tracking.mlflow_store import (
    MLFLOW_STATUS,
    MetricPoint,
    MlflowStore,
    artifact_root,
    mlflow_uri,
    param_items,
)
from pipelinerl.platform.tracking.store import PlatformStore


class ParentRun:
    """The MLflow run and platform-database row that group child runs (a comparison, a sweep).

    Children are launched with ``parent_mlflow_run_id=parent.mlflow_run_id`` and
    ``parent_run_id=parent.run_id``; the parent gets the figures and tables that span them.
    """

    def __init__(
        self,
        config: PipelineConfig,
        run_id: str,
        kind: str,
        tags: Mapping[str, str] | None = None,
        prefect_flow_run_id: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.store = PlatformStore(database_url(config))
        self.mlflow = MlflowStore(mlflow_uri(config), artifact_root(config))
        all_tags = {"kind": kind, "task": config.task.name, **(tags or {})}
        if prefect_flow_run_id:
            all_tags["prefect_flow_run_id"] = prefect_flow_run_id
        self.mlflow_run_id = self.mlflow.start_run(config.run.name, run_id, all_tags)
        self.mlflow.log_params(self.mlflow_run_id, param_items(config))
        self.store.create_run(
            run_id,
            name=config.run.name,
            mode=kind,
            config=config.model_dump(mode="json"),
            started_at=datetime.now(UTC),
            mlflow_run_id=self.mlflow_run_id,
            prefect_flow_run_id=prefect_flow_run_id,
        )
        self.summary: dict[str, Any] | None = None

    def log_table(self, summary: dict[str, Any], artifact_file: str, metrics: Mapping[str, float]) -> None:
        self.summary = summary
        self.mlflow.log_dict(self.mlflow_run_id, summary, artifact_file)
        now = time.time()
        self.mlflow.log_metrics(
            self.mlflow_run_id, [MetricPoint(k, float(v), 0, now) for k, v in metrics.items()]
        )

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        self.mlflow.log_figure(self.mlflow_run_id, figure, artifact_file)

    def finish(self, outcome: str) -> None:
        self.mlflow.end_run(self.mlflow_run_id, MLFLOW_STATUS[outcome])
        self.store.finish_run(self.run_id, status=outcome, ended_at=datetime.now(UTC), summary=self.summary)


@contextlib.contextmanager
def parent_run(
    config: PipelineConfig,
    run_id: str,
    kind: str,
    tags: Mapping[str, str] | None = None,
    prefect_flow_run_id: str | None = None,
) -> Iterator[ParentRun | None]:
    """A ``ParentRun`` for the block (None when tracking is off), finished with its outcome:
    "finished" when the block completes, "failed" on an exception, "killed" on a signal or
    cancellation (a ``BaseException`` that is not an ``Exception``)."""
    if not config.tracking.enabled:
        yield None
        return
    parent = ParentRun(config, run_id, kind, tags, prefect_flow_run_id)
    outcome = "failed"
    try:
        yield parent
        outcome = "finished"
    except BaseException as error:
        outcome = "failed" if isinstance(error, Exception) else "killed"
        raise
    finally:
        parent.finish(outcome)
