"""What the dashboard reads from MLflow: the metrics the platform database does not keep.

The database holds the trainer's side of every step; the actors' throughput, idle fraction and
update pauses, the rollout queue, held-out evaluations and restarts reach MLflow only (through the
run tracker), so the run page reads their histories here. Read-only: no experiment or run is
created. Links into MLflow's own UI open the classic (machine-learning) run view: MLflow 3 opens
its GenAI traces view unless the URL says ``workflowType=machine_learning``.

Metric names come back under their current names (``metric_registry.canonical_metrics``), and a
history asked for by its current name is read from its old names too (``old_names``), so a run
logged before the metric renames shows like a new one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelinerl.platform.tracking.metric_registry import canonical_metrics, old_names
from pipelinerl.platform.tracking.mlflow_store import HTTP_RETRY_DEFAULTS

# MLflow 3's UI (checked in 3.17's bundle): workflowType is "machine_learning" or "genai".
MLFLOW_CLASSIC_VIEW = "workflowType=machine_learning"
# Runs whose latest metrics one search asks for; MLflow's filter grows with every id.
SEARCH_CHUNK = 100
# After MLflow could not be reached, seconds before the next attempt (the pages refresh every few).
RETRY_AFTER_S = 30.0
# Error codes with which a reachable store answers a request it cannot serve (not an outage).
ANSWERS = frozenset(
    {"RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "BAD_REQUEST", "PERMISSION_DENIED"}
)


class MlflowUnavailable(RuntimeError):
    """MLflow could not be read; the message names the store and the cause."""


@dataclass(frozen=True, slots=True)
class MetricPoint:
    step: int
    timestamp_s: float
    value: float


class MlflowReader:
    """Metric histories and latest values of MLflow runs, on one client."""

    def __init__(self, tracking_uri: str, ui_url: str | None) -> None:
        for name, value in HTTP_RETRY_DEFAULTS.items():
            os.environ.setdefault(name, value)
        self.tracking_uri = tracking_uri
        self.ui_url = ui_url.rstrip("/") if ui_url else None
        self._client_instance: Any = None
        self._experiment_of_run: dict[str, str] = {}
        self._unavailable: str | None = None  # why the store could not be read, until _retry_at
        self._retry_at = 0.0

    @property
    def _client(self) -> Any:
        """The client, made on first use: MLflow creates a SQLite store it opens if the file is
        missing, and the dashboard must not write, so a missing file is an error instead."""
        if self._client_instance is None:
            if self.tracking_uri.startswith("sqlite:///"):
                path = Path(self.tracking_uri.removeprefix("sqlite:///"))
                if not path.is_file():
                    raise MlflowUnavailable(f"MLflow store {self.tracking_uri!r}: no such file")
            from mlflow.tracking import MlflowClient  # noqa: PLC0415 (MLflow takes seconds: the dashboard starts without it)

            self._client_instance = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client_instance

    def run_url(self, mlflow_run_id: str, *, lookup: bool = True) -> str | None:
        """The run in MLflow's UI, in its training view; None without a UI or an unknown run. Without
        ``lookup`` only runs whose experiment an earlier search or lookup found get one."""
        if self.ui_url is None:
            return None
        experiment_id = self._experiment_of_run.get(mlflow_run_id)
        if experiment_id is None and not lookup:
            return None
        if experiment_id is None:
            try:
                experiment_id = self._call(lambda: self._client.get_run(mlflow_run_id).info.experiment_id)
            except MlflowUnavailable:
                return None
            self._experiment_of_run[mlflow_run_id] = str(experiment_id)
        return f"{self.ui_url}/#/experiments/{experiment_id}/runs/{mlflow_run_id}?{MLFLOW_CLASSIC_VIEW}"

    def latest_metrics(
        self, experiments: Iterable[str], mlflow_run_ids: Sequence[str]
    ) -> dict[str, dict[str, float]]:
        """Each run's latest value of every metric, by MLflow run id (a few searches in all)."""
        wanted = list(dict.fromkeys(mlflow_run_ids))
        if not wanted:
            return {}

        def search() -> dict[str, dict[str, float]]:
            experiment_ids = [
                experiment.experiment_id
                for name in sorted(set(experiments))
                if (experiment := self._client.get_experiment_by_name(name)) is not None
            ]
            if not experiment_ids:
                return {}
            found: dict[str, dict[str, float]] = {}
            for start in range(0, len(wanted), SEARCH_CHUNK):
                chunk = wanted[start : start + SEARCH_CHUNK]
                ids = ", ".join(f"'{run_id}'" for run_id in chunk)
                for run in self._client.search_runs(
                    experiment_ids, filter_string=f"attributes.run_id IN ({ids})", max_results=len(chunk)
                ):
                    self._experiment_of_run[run.info.run_id] = str(run.info.experiment_id)
                    found[run.info.run_id] = canonical_metrics(run.data.metrics)
            return found

        return self._call(search)

    def latest_of_run(self, mlflow_run_id: str) -> dict[str, float]:
        """The run's latest value of each metric (one call, however long the histories)."""
        return canonical_metrics(self._call(lambda: self._client.get_run(mlflow_run_id).data.metrics))

    def histories(self, mlflow_run_id: str, keys: Iterable[str]) -> dict[str, list[MetricPoint]]:
        """The full history of each metric key (absent keys give empty lists), by step then time; a key
        never logged under its current name is read under its old ones."""

        def read() -> dict[str, list[MetricPoint]]:
            result: dict[str, list[MetricPoint]] = {}
            for key in keys:
                points: list[MetricPoint] = []
                for name in (key, *old_names(key)):
                    points = [
                        MetricPoint(int(m.step), m.timestamp / 1000.0, float(m.value))
                        for m in self._client.get_metric_history(mlflow_run_id, name)
                    ]
                    if points:
                        break
                result[key] = sorted(points, key=lambda p: (p.step, p.timestamp_s))
            return result

        return self._call(read)

    def _call(self, read: Any) -> Any:
        """``read()``, its failures as ``MlflowUnavailable``; after an unreachable store, every call
        fails at once for ``RETRY_AFTER_S`` (each page refresh would otherwise wait out the HTTP
        timeouts again), then tries again."""
        from mlflow.exceptions import MlflowException  # noqa: PLC0415 (MLflow takes seconds: the dashboard starts without it)

        if self._unavailable is not None and time.monotonic() < self._retry_at:
            raise MlflowUnavailable(self._unavailable)
        try:
            result = read()
        except MlflowUnavailable as error:
            self._failed(str(error))
            raise
        except MlflowException as error:
            message = f"MLflow store {self.tracking_uri!r}: {error.message}"
            if error.error_code not in ANSWERS:  # MLflow reports a refused connection as INTERNAL_ERROR
                self._failed(message)
            raise MlflowUnavailable(message) from None
        except Exception as error:  # connection errors surface as many types
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            message = f"MLflow store {self.tracking_uri!r} is not readable: {first_line}"
            self._failed(message)
            raise MlflowUnavailable(message) from None
        self._unavailable = None
        return result

    def _failed(self, message: str) -> None:
        self._unavailable = message
        self._retry_at = time.monotonic() + RETRY_AFTER_S
