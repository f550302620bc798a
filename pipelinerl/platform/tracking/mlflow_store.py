"""MLflow for the platform: where its store is, run tags and params, and the few client calls made.

An unreachable store fails fast with a ``TrackingError`` naming the URI (``check_reachable``);
HTTP retries are capped so a server that went away delays the tracking thread, never a stage.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelinerl.platform.config import PipelineConfig, flatten

MAX_METRICS_PER_BATCH = 1000  # MLflow's limit for one log_batch call
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_LENGTH = 6000


# The metric names MLflow accepts (its own check, mlflow/utils/validation.py).
METRIC_NAME = re.compile(r"^[/\w.\- :]*$")
logger = logging.getLogger("pipelinerl.tracking")


class TrackingError(RuntimeError):
    """The tracking store cannot be used; the message names the URI and the cause."""


def mlflow_uri(config: PipelineConfig) -> str:
    """``tracking.mlflow_uri``, else ``MLFLOW_TRACKING_URI``, else SQLite in the platform home."""
    if config.tracking.mlflow_uri:
        return config.tracking.mlflow_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    home = config.run.home.expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'mlflow.db'}"


# MLflow 3's UI opens a run in its GenAI (traces) view unless the link asks for the classic one, where
# a training run's metrics, charts and artifacts are (the parameter as its 3.17 bundle reads it).
MLFLOW_TRAINING_VIEW = "workflowType=machine_learning"


def mlflow_run_url(ui_url: str, experiment_id: str, run_id: str) -> str:
    """The link to a run in MLflow's UI, opening its training view (metrics and charts)."""
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{MLFLOW_TRAINING_VIEW}"


def mlflow_experiment_url(ui_url: str, experiment_id: str) -> str:
    """The link to an experiment's runs in MLflow's UI, in its training view."""
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}?{MLFLOW_TRAINING_VIEW}"


def artifact_root(config: PipelineConfig) -> str | None:
    """Where artifacts go for a local store (a server chooses its own): the platform home."""
    uri = mlflow_uri(config)
    if uri.startswith(("http://", "https://", "databricks")):
        return None
    return (config.run.home.expanduser() / "mlartifacts").resolve().as_uri()


def git_commit() -> str | None:
    """The commit of the code being run (None outside a git checkout)."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None


def run_tags(config: PipelineConfig, model_path: Path, prefect_flow_run_id: str | None) -> dict[str, str]:
    tags = {
        "mode": config.run.mode,
        "task": config.task.name,
        "model": str(model_path),
        "engine": config.actor.engine,
    }
    # A model or dataset named by Hub id: what was asked (id, revision; empty is main) and what was loaded.
    for prefix, snapshot in (("model", config.model.hub_snapshot), ("dataset", config.task.hub_snapshot)):
        if snapshot is not None:
            tags[f"{prefix}.hub_id"] = snapshot.id
            tags[f"{prefix}.revision"] = snapshot.revision or "main"
            tags[f"{prefix}.commit"] = snapshot.commit
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
        tags["git_commit"] = commit
    if prefect_flow_run_id:
        tags["prefect_flow_run_id"] = prefect_flow_run_id
    return tags


def param_items(config: PipelineConfig) -> list[tuple[str, str]]:
    return [(key, str(value)[:MAX_PARAM_LENGTH]) for key, value in sorted(flatten(config).items())]


# ----- MLflow -----


# An unreachable server must not stall the tracking thread for minutes of HTTP retries: the outbox
# retries at the next flush anyway. Applied to this process unless the user set them.
HTTP_RETRY_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}
PROBE_TIMEOUT_S = 5.0


def check_reachable(uri: str, what: str = "MLflow store") -> None:
    """Fail at once, with a clear message, when ``uri`` cannot be reached (server or database)."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=PROBE_TIMEOUT_S):
                return
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise TrackingError(
                f"{what} {uri!r} is not reachable ({reason}); start the server, or point "
                "tracking.mlflow_uri / MLFLOW_TRACKING_URI elsewhere"
            ) from None
    if "://" in uri and not uri.startswith(("sqlite:", "file:")):
        import sqlalchemy

        try:
            engine = sqlalchemy.create_engine(uri, connect_args={"connect_timeout": int(PROBE_TIMEOUT_S)})
            with engine.connect():
                pass
            engine.dispose()
        except Exception as error:  # driver errors vary; the first line names the cause
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            shown = sqlalchemy.engine.make_url(uri).render_as_string(hide_password=True)
            raise TrackingError(f"{what} {shown!r} is not reachable: {first_line}") from None


class MlflowStore:
    """The few MLflow calls the platform makes, on one client."""

    def __init__(self, uri: str, artifact_location: str | None = None) -> None:
        for name, value in HTTP_RETRY_DEFAULTS.items():
            os.environ.setdefault(name, value)
        check_reachable(uri)
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.artifact_location = artifact_location
        self.client = MlflowClient(tracking_uri=uri)
        self._refused: set[str] = set()  # metric names MLflow would refuse, already reported

    def experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        try:
            experiment = self.client.get_experiment_by_name(name)
            if experiment is not None:
                return str(experiment.experiment_id)
            try:
                return str(self.client.create_experiment(name, artifact_location=self.artifact_location))
            except MlflowException as error:
                # Two runs starting at once both found no experiment; the other one created it first.
                if error.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                created = self.client.get_experiment_by_name(name)
                if created is None:
                    raise
                return str(created.experiment_id)
        except MlflowException as error:
            raise TrackingError(f"MLflow store {self.uri!r}: {error.message}") from None
        except Exception as error:  # connection errors surface as many types
            raise TrackingError(f"MLflow store {self.uri!r} is not reachable: {error}") from None

    def start_run(
        self, experiment: str, run_name: str, tags: Mapping[str, str], parent_run_id: str | None = None
    ) -> str:
        tags = dict(tags)
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id(experiment), run_name=run_name, tags=tags)
        return str(run.info.run_id)

    def log_params(self, run_id: str, items: Sequence[tuple[str, str]]) -> None:
        from mlflow.entities import Param

        params = [Param(key, value) for key, value in items]
        for start in range(0, len(params), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=params[start : start + MAX_PARAMS_PER_BATCH])

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self.client.set_tag(run_id, key, value)

    def log_metrics(self, run_id: str, points: Sequence[MetricPoint]) -> None:
        """Log ``points`` in batches; a name MLflow would refuse is dropped (said once), not sent: one
        bad name would fail every batch it is in, and the run's tracking with it."""
        from mlflow.entities import Metric

        for key in sorted({p.key for p in points if not METRIC_NAME.match(p.key)} - self._refused):
            self._refused.add(key)
            logger.error("metric %r not logged: MLflow names allow only letters, digits and _-. :/", key)
        metrics = [
            Metric(p.key, p.value, int(p.timestamp * 1000), p.step)
            for p in points
            if METRIC_NAME.match(p.key)
        ]
        for start in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            self.client.log_batch(run_id, metrics=metrics[start : start + MAX_METRICS_PER_BATCH])

    def log_figure(self, run_id: str, figure: Any, artifact_file: str) -> None:
        self.client.log_figure(run_id, figure, artifact_file)

    def log_dict(self, run_id: str, data: dict[str, Any], artifact_file: str) -> None:
        self.client.log_dict(run_id, data, artifact_file)

    def log_checkpoint(self, run_id: str, experiment: str, checkpoint: CheckpointRecord) -> str:
        """A logged model pointing at the checkpoint directory (weights are not copied)."""
        from mlflow.entities import LoggedModelStatus

        model = self.client.create_logged_model(
            experiment_id=self.experiment_id(experiment),
            name=f"policy-v{checkpoint.policy_version:06d}",
            source_run_id=run_id,
            params={"policy_version": str(checkpoint.policy_version)},
            tags={
                "policy_version": str(checkpoint.policy_version),
                "samples_trained": str(checkpoint.samples_trained),
                "checkpoint": checkpoint.path,
            },
            model_type="pipelinerl-policy",
        )
        self.client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
        return str(model.model_id)

    def reopen_run(self, run_id: str) -> None:
        """An ended run running again (a run resumed in place); its end time is set again when it ends."""
        self.client.update_run(run_id, status="RUNNING")

    def end_run(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status=status)


@dataclass(frozen=True)
class MetricPoint:
    key: str
    value: float
    step: int
    timestamp: float


@dataclass(frozen=True)
class CheckpointRecord:
    policy_version: int
    samples_trained: int
    path: str


MLFLOW_STATUS = {"finished": "FINISHED", "failed": "FAILED", "killed": "KILLED", "crashed": "FAILED"}
