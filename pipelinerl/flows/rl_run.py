"""The ``rl-run`` Prefect flow: one PipelineRL (or baseline) run, launched and watched from Prefect.

The flow takes the whole run configuration as one typed parameter (``PipelineConfig``), so the
Prefect UI renders a form with every field's description, dropdowns for choices and the
constraints checked before anything starts. On one machine the flow runs the launcher
(``launch/launcher.py``): the actor, preprocessor and trainer processes, supervised until the
trainer ends; with ``cluster.placement = "pools"`` it submits one ``rl-role`` flow run per role
and node to the ``trainers`` and ``actors`` work pools instead (``flows/placement.py``) and
supervises those. While it runs, the flow

* streams every stage's log into the flow run's logs (``StageLogForwarder``);
* publishes progress as a Prefect table artifact (version, reward, ESS, lag) and links the MLflow
  run in a markdown artifact;
* tags the MLflow run with its flow-run id, so each can be found from the other.

A crashed stage fails the flow run with that stage's log tail (``StageFailed``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run

from pipelinerl.flows.placement import placement_for
from pipelinerl.launch.launcher import launch, new_run_id
from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.tracking.mlflow_store import mlflow_run_url, mlflow_uri

PROGRESS_EVERY = 10  # policy versions between two progress artifacts
LOG_POLL_S = 1.0
ARTIFACT_KEY = "rl-run-progress"


class PlatformLogs(logging.Handler):
    """While the flow runs, the platform's own log records (the warm-start's progress, tracking
    warnings) go to the flow run's logger too: Prefect shows only its own loggers' records."""

    def __init__(self, target: Any, source: str = "pipelinerl") -> None:
        super().__init__(level=logging.INFO)
        self.target = target
        self.source = logging.getLogger(source)

    def emit(self, record: logging.LogRecord) -> None:
        self.target.log(record.levelno, "%s", record.getMessage())

    def __enter__(self) -> PlatformLogs:
        self.source.addHandler(self)
        self._level = self.source.level
        if self.source.getEffectiveLevel() > logging.INFO:
            self.source.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.source.removeHandler(self)
        self.source.setLevel(self._level)


class StageLogForwarder:
    """Tails ``<run_dir>/logs/*.log`` and sends each new line to a logger, prefixed by its stage."""

    def __init__(self, logs_dir: Path, logger: Any, names: set[str] | None = None) -> None:
        self.logs_dir = logs_dir
        self.logger = logger
        self.names = names  # only these stages' logs (None: every stage's)
        self.offsets: dict[Path, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stage-logs", daemon=True)

    def __enter__(self) -> StageLogForwarder:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.forward()

    def _loop(self) -> None:
        while not self._stop.wait(LOG_POLL_S):
            self.forward()

    def forward(self) -> None:
        if not self.logs_dir.is_dir():
            return
        for path in sorted(self.logs_dir.glob("*.log")):
            if self.names is not None and path.stem not in self.names:
                continue
            offset = self.offsets.get(path, 0)
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
            end = data.rfind(b"\n") + 1
            self.offsets[path] = offset + end
            for line in data[:end].decode(errors="replace").splitlines():
                if line.strip():
                    self.logger.info("[%s] %s", path.stem, line)


def progress_rows(
    records: Sequence[dict[str, Any]], evals: Sequence[dict[str, Any]] = ()
) -> list[dict[str, Any]]:
    """The progress table: one row per policy version, with the latest in-run eval of each set at that
    version (named by set when there are several)."""
    rows = []
    latest: dict[str, dict[str, Any]] = {}
    named = len({e.get(registry.EVAL_SET) for e in evals}) > 1
    pending = sorted(evals, key=lambda e: e[registry.POLICY_VERSION])
    pass_at_1 = registry.name_of(registry.EVAL_PASS_AT, k=1)
    for r in records:
        while pending and pending[0][registry.POLICY_VERSION] <= r[registry.POLICY_VERSION]:
            record = pending.pop(0)
            latest[record.get(registry.EVAL_SET, "")] = record
        rows.append(
            {
                "version": r[registry.POLICY_VERSION],
                "reward": round(r[registry.REWARD_MEAN], 4),
                "ESS": round(r[registry.ESS], 4),
                "lag mean": round(r[registry.LAG_MEAN], 3),
                "lag max": r[registry.LAG_MAX],
                "samples": r[registry.SAMPLES_TRAINED],
                "wall s": round(r[registry.WALL_S], 1),
                "eval pass@1": " ".join(
                    f"{name + ' ' if named else ''}{e[pass_at_1]:.3f} (v{e[registry.POLICY_VERSION]})"
                    for name, e in latest.items()
                ),
            }
        )
    return rows


class ProgressArtifacts:
    """Collects trainer records; every ``PROGRESS_EVERY`` versions, a new table artifact version."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self._published = 0

    def add_evals(self, records: Sequence[dict[str, Any]]) -> None:
        self.evals.extend(records)

    def add(self, records: Sequence[dict[str, Any]]) -> None:
        self.records.extend(records)
        if self.records and self.records[-1]["policy_version"] - self._published >= PROGRESS_EVERY:
            self.publish()

    def publish(self) -> None:
        if not self.records:
            return
        self._published = self.records[-1]["policy_version"]
        create_table_artifact(
            key=ARTIFACT_KEY,
            table=progress_rows(self.records, self.evals),
            description=f"Progress up to policy version {self._published}",
        )


def mlflow_link_markdown(config: PipelineConfig, run_dir: Path, experiment_id: str | None = None) -> str:
    """The run's MLflow artifact: its run id and store and, on a server, a link to the run's training
    view (``experiment_id``: read from the store when not given)."""
    uri = mlflow_uri(config)
    run_id_file = run_dir / "mlflow_run_id"
    mlflow_run_id = run_id_file.read_text() if run_id_file.exists() else None
    lines = [f"# Run `{run_dir.name}`", "", f"* MLflow run: `{mlflow_run_id or '(not tracked)'}` in `{uri}`"]
    if mlflow_run_id and uri.startswith(("http://", "https://")):
        experiment_id = experiment_id or _experiment_of(uri, mlflow_run_id)
        if experiment_id is not None:
            lines.append(f"* Open: {mlflow_run_url(uri, experiment_id, mlflow_run_id)}")
    lines.append(f"* Run directory: `{run_dir}`")
    return "\n".join(lines)


class MlflowLinkArtifact:
    """The run's MLflow link as a Prefect artifact, created once the run's MLflow run exists."""

    def __init__(self, config: PipelineConfig, run_dir: Path) -> None:
        self.config, self.run_dir = config, run_dir
        self.published = False

    def publish_once(self) -> None:
        if self.published or not (self.run_dir / "mlflow_run_id").is_file():
            return
        self.published = True
        create_markdown_artifact(
            key="rl-run-mlflow", markdown=mlflow_link_markdown(self.config, self.run_dir)
        )


def _experiment_of(uri: str, mlflow_run_id: str) -> str | None:
    from mlflow.tracking import MlflowClient  # noqa: PLC0415 (MLflow: rl_role imports this module, never uses it)

    try:
        return str(MlflowClient(tracking_uri=uri).get_run(mlflow_run_id).info.experiment_id)
    except Exception:  # the link is a convenience: an unreachable server leaves it out
        return None


@flow(name="rl-run", log_prints=True)
def rl_run(config: PipelineConfig = PipelineConfig()) -> dict[str, Any]:  # noqa: B008 (the form's default)
    """Run PipelineRL (or a baseline, by `run.mode`) on this machine and return its summary.

    Args:
        config: The experiment, every section of the TOML config (`pipelinerl config show` prints it).
    """
    logger = get_run_logger()
    run_id = new_run_id(config.run.mode)
    run_dir = (config.run.output_dir / run_id).resolve()
    progress = ProgressArtifacts()
    link = MlflowLinkArtifact(config, run_dir)

    def on_status(text: str) -> None:
        logger.info("%s", text)
        link.publish_once()  # as soon as the MLflow run exists, not only after a run that finished

    # Placed on the pools, each role's flow run streams its own stages' logs.
    forward_logs = config.cluster.placement == "local"
    try:
        with (
            PlatformLogs(logger),
            StageLogForwarder(run_dir / "logs", logger) if forward_logs else contextlib.nullcontext(),
        ):
            result = launch(
                config,
                run_id=run_id,
                on_records=progress.add,
                on_eval=progress.add_evals,
                on_status=on_status,
                prefect_flow_run_id=str(flow_run.id) if flow_run.id else None,
                placement=placement_for(config, lambda text: logger.info("%s", text)),
            )
    finally:
        link.publish_once()  # a failed or cancelled run keeps its link too
    progress.publish()
    summary = result.summary
    logger.info(
        "held-out success %.1f%% -> %.1f%%, ESS %.3f, lag mean %.2f max %d",
        100 * summary["eval_success_start"],
        100 * summary["eval_success_end"],
        summary["ess_mean"],
        summary["lag_mean"],
        summary["lag_max"],
    )
    return summary
