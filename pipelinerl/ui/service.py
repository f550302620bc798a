"""The dashboard's data: one object that asks the readers (platform database, MLflow, run files) and
returns the JSON-ready payloads of the API. No web framework here; ``api.py`` maps its errors.

Where each number comes from: the platform database for runs, steps, lag histograms, policy
versions, update pauses (the trainer's broadcast and actor 0's pause) and checkpoints; MLflow for
the actors' throughput and idle fraction, the rollout queue, held-out evaluations and restarts; the
run directory for lag by token position, multi-version sequences, the batches waiting ahead of
the trainer and a planned run's prediction beside what it measured (see ``run_files.py``). An
unreadable MLflow or run directory leaves those parts empty and says why in ``warnings``; an
unreadable database is an error (``PlatformDatabaseError``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelinerl.platform.run_phase import read_phase
from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.tracking.catch_up import mark_crashed_and_catch_up
from pipelinerl.platform.tracking.db import RUN_STATUSES, PlatformDatabaseError, display_url
from pipelinerl.platform.tracking.liveness import HEARTBEAT_S
from pipelinerl.platform.tracking.store import PlatformStore
from pipelinerl.ui.mlflow_reader import MetricPoint, MlflowReader, MlflowUnavailable
from pipelinerl.ui.queries import (
    NotFound,
    PlatformReader,
    PolicyVersionRow,
    RunFilter,
    RunListRow,
)
from pipelinerl.ui.run_files import RunFiles, read_prediction, run_directory
from pipelinerl.ui.sampling import keep_indices
from pipelinerl.ui.series import (
    STAGE_WINDOW,
    ComparedRun,
    comparison_table,
    eval_series,
    lag_heatmap,
    rewards_of,
    run_state,
    stage_boxes,
    step_columns,
    trainer_points,
    training_started_at,
    wall_time_s,
)

# MLflow metrics of the run page (metric_registry: all actors under the plain names, each actor under
# actor/<k>/...; the reader renames a run's old names).
ACTOR_THROUGHPUT = registry.ACTOR_TOKENS_PER_S
ACTOR_IDLE = registry.ACTOR_IDLE_FRACTION
QUEUE_ROLLOUTS = registry.QUEUE_ROLLOUTS
RESTARTS = registry.RUN_RESTARTS
EVAL_SUCCESS = registry.EVAL_SUCCESS  # greedy held-out success at the start and the end of a run
COMPARE_KINDS = ("compare", "sweep")


class Dashboard:
    """The payloads of the API, from the readers of one platform database and one MLflow store."""

    def __init__(self, database: PlatformReader, mlflow: MlflowReader | None, prefect_ui_url: str | None):
        self.database = database
        self.mlflow = mlflow
        self.prefect_ui_url = prefect_ui_url.rstrip("/") if prefect_ui_url else None
        self.files = RunFiles()
        self._crash_check_at = -math.inf  # time.monotonic() of the last check for crashed runs

    # -- health and the runs list ---------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        database: dict[str, Any] = {"url": display_url(self.database.url), "ok": True, "error": None}
        try:
            self.database.ping()
        except PlatformDatabaseError as error:
            database.update(ok=False, error=str(error))
        return {"database": database, "mlflow": None if self.mlflow is None else self.mlflow.tracking_uri}

    def runs(self, run_filter: RunFilter) -> dict[str, Any]:
        experiments = self.database.experiments()
        if run_filter.experiment is not None and run_filter.experiment not in experiments:
            raise NotFound(f"no experiment {run_filter.experiment!r} in the platform database")
        if run_filter.parent_run_id is not None:
            self.database.run(run_filter.parent_run_id)
        warnings: list[str] = []
        self._mark_crashed_runs(warnings)
        rows = self.database.list_runs(run_filter)
        latest = self._latest_mlflow_metrics(rows, warnings)
        now = datetime.now(UTC)
        return {
            # links only for the runs the search found: a lookup per run would cost a request each
            "runs": [
                self._run_json(row, latest.get(row.mlflow_run_id or ""), now, lookup=False) for row in rows
            ],
            "experiments": experiments,
            "modes": sorted({row.mode for row in rows} | {"pipeline", "conventional", "async"}),
            "statuses": list(RUN_STATUSES),
            "warnings": warnings,
        }

    def _mark_crashed_runs(self, warnings: list[str]) -> None:
        """Runs whose launcher is gone are marked crashed and their stores caught up here as by
        ``pipelinerl runs list`` (``tracking/catch_up.py``), at most once per heartbeat interval."""
        if time.monotonic() - self._crash_check_at < HEARTBEAT_S:
            return
        self._crash_check_at = time.monotonic()

        try:
            with PlatformStore(self.database.url, migrate=False) as store:
                uri = None if self.mlflow is None else self.mlflow.tracking_uri
                for run, caught in mark_crashed_and_catch_up(store, uri):
                    warnings.append(
                        f"run {run.id} marked crashed (launcher gone); caught up {caught.describe()}"
                    )
        except Exception as error:  # a read-only or unreachable database: the listing still answers
            warnings.append(f"crashed runs not checked: {str(error)[:200]}")

    def run(self, run_id: str) -> dict[str, Any]:
        row = self.database.run(run_id)
        warnings: list[str] = []
        latest = self._latest_mlflow_metrics([row], warnings)
        payload = self._run_json(row, latest.get(row.mlflow_run_id or ""), datetime.now(UTC), lookup=True)
        payload["config"] = row.config
        payload["children"] = [child.id for child in self.database.children(row.id)]
        payload["warnings"] = warnings
        return payload

    def _run_json(
        self, row: RunListRow, mlflow_latest: dict[str, float] | None, now: datetime, *, lookup: bool
    ) -> dict[str, Any]:
        state = run_state(row.status, row.started_at, row.last_step_at, now, row.heartbeat_at)
        summary = row.summary or {}
        mlflow_latest = mlflow_latest or {}
        # A finished run's last evaluation is the one at its end (after any in-run evaluation).
        if summary.get("eval_success_end") is not None:
            latest_eval: dict[str, Any] | None = {
                "name": EVAL_SUCCESS,
                "value": float(summary["eval_success_end"]),
            }
        else:
            latest_eval = _latest_eval(mlflow_latest)
        return {
            "id": row.id,
            "experiment": row.name,
            "mode": row.mode,
            "status": row.status,
            "heartbeat_age_s": None if state.heartbeat_age_s is None else round(state.heartbeat_age_s, 1),
            "silent": state.silent,
            "policy_version": row.policy_version,
            "steps": row.steps,
            "reward_mean": row.reward_mean,
            "latest_eval": latest_eval,
            "ess": row.ess,
            "lag_max": row.lag_max,
            "tokens_per_s": {
                "actor": mlflow_latest.get(ACTOR_THROUGHPUT),
                "trainer": row.trainer_tokens_per_s,
            },
            "started_at": row.started_at.isoformat(),
            "ended_at": None if row.ended_at is None else row.ended_at.isoformat(),
            "wall_s": round(wall_time_s(row.started_at, row.ended_at, now), 1),
            "parent_run_id": row.parent_run_id,
            "mlflow_run_id": row.mlflow_run_id,
            "prefect_flow_run_id": row.prefect_flow_run_id,
            "links": {
                "prefect": None
                if self.prefect_ui_url is None or row.prefect_flow_run_id is None
                else f"{self.prefect_ui_url}/runs/flow-run/{row.prefect_flow_run_id}",
                "mlflow": None
                if self.mlflow is None or row.mlflow_run_id is None
                else self.mlflow.run_url(row.mlflow_run_id, lookup=lookup),
            },
            "summary": row.summary,
        }

    def _latest_mlflow_metrics(self, rows: Sequence[RunListRow], warnings: list[str]) -> dict[str, dict]:
        ids = [row.mlflow_run_id for row in rows if row.mlflow_run_id]
        if self.mlflow is None or not ids:
            return {}
        try:
            return self.mlflow.latest_metrics({row.name for row in rows}, ids)
        except MlflowUnavailable as error:
            warnings.append(str(error))
            return {}

    # -- one run's series -----------------------------------------------------------------------------

    def steps(self, run_id: str, max_points: int) -> dict[str, Any]:
        row = self.database.run(run_id)
        steps = self.database.steps(run_id)
        return step_columns(steps, training_started_at(steps, row.started_at), max_points)

    def lag_histogram(self, run_id: str, version: int | None) -> dict[str, Any]:
        self.database.run(run_id)
        found, counts = self.database.lag_histogram(run_id, version)
        if version is not None and not counts:
            raise NotFound(f"run {run_id!r} has no lag histogram for policy version {version}")
        total = sum(counts.values())
        return {
            "version": found,
            "lag": list(counts),
            "count": list(counts.values()),
            "fraction": [round(count / total, 6) for count in counts.values()] if total else [],
        }

    def lag_by_position(self, run_id: str, max_steps: int) -> dict[str, Any]:
        row = self.database.run(run_id)
        run_dir = self._run_dir(row)
        if run_dir is None:
            return {**lag_heatmap([], max_steps), "warnings": [_no_run_dir(row)]}
        return {**lag_heatmap(self._trainer_records(row, run_dir), max_steps), "warnings": []}

    def live(self, run_id: str, max_points: int) -> dict[str, Any]:
        """What the run page refreshes every few seconds besides the step series: the stage boxes,
        held-out evaluations, update pauses by phase, multi-version sequences, checkpoints, restarts,
        and a planned run's prediction beside what it measured."""
        row = self.database.run(run_id)
        now = datetime.now(UTC)
        warnings: list[str] = []
        versions = self.database.policy_versions(run_id)
        first_step = self.database.steps(run_id, first=1)
        recent_steps = self.database.steps(run_id, last=STAGE_WINDOW)
        started_at = training_started_at(first_step, row.started_at)
        started = started_at.timestamp()
        latest, histories = self._mlflow_metrics(row, warnings)
        run_dir = self._run_dir(row, versions)
        trainer_records = self._trainer_records(row, run_dir) if run_dir else []
        preprocessor_records = self.files.preprocessor_records(run_dir) if run_dir else []
        if run_dir is None:
            warnings.append(_no_run_dir(row))

        stages = stage_boxes(
            recent_steps,
            actor_tokens_per_s=latest.get(ACTOR_THROUGHPUT),
            actor_idle=latest.get(ACTOR_IDLE),
            rollout_queue=latest.get(QUEUE_ROLLOUTS),
            by_actor=_by_actor(latest),
            preprocessor_records=preprocessor_records,
        )
        # Each policy version's row is its trainer step's (time, samples); the first step adds the
        # samples it trained, which place a resumed run's starting policy (comparison.trained_at).
        evals = eval_series(_evals(histories), trainer_points([*versions, *first_step], started_at))
        pause_phases = [
            {
                "version": v.version,
                "wall_s": round(v.created_at.timestamp() - started, 3),
                "broadcast_ms": v.broadcast_ms,
                "pause_ms": v.pause_ms,
            }
            for v in versions
        ]
        kept = keep_indices(
            [(p["broadcast_ms"] or 0) + (p["pause_ms"] or 0) for p in pause_phases], max_points
        )
        multi_version = [
            {
                "version": int(r[registry.POLICY_VERSION]),
                "sequences": int(r[registry.TRAINER_INFLIGHT_SEQUENCES]),
            }
            for r in trainer_records
            if registry.TRAINER_INFLIGHT_SEQUENCES in r
        ]
        kept_multi = keep_indices([m["sequences"] for m in multi_version], max_points)
        state = run_state(row.status, row.started_at, row.last_step_at, now, row.heartbeat_at)
        return {
            "id": row.id,
            "status": row.status,
            "silent": state.silent,
            "heartbeat_age_s": round(state.heartbeat_age_s or 0.0, 1),
            "policy_version": row.policy_version,
            "wall_s": round(wall_time_s(row.started_at, row.ended_at, now), 1),
            "stages": stages,
            "evals": evals,
            "pauses": [pause_phases[i] for i in kept],
            "multi_version_sequences": [multi_version[i] for i in kept_multi],
            "checkpoints": [
                {"version": v.version, "path": v.checkpoint_path, "samples_trained": v.samples_trained}
                for v in versions
                if v.checkpoint_path
            ],
            "restarts": [
                {"restart": int(p.value), "version": p.step, "wall_s": round(p.timestamp_s - started, 3)}
                for p in histories.get(RESTARTS, [])
            ],
            # the simulator's prediction beside what the run measured (a planned run, once ended)
            "prediction": read_prediction(run_dir) if run_dir else None,
            # what a running run does now, in words (before its first step, all the page has to say)
            "phase": _phase(run_dir, row.status, now),
            "warnings": warnings,
        }

    def _mlflow_metrics(
        self, row: RunListRow, warnings: list[str]
    ) -> tuple[dict[str, float], dict[str, list[MetricPoint]]]:
        """The run's latest value of every MLflow metric, and the histories of the few the pages draw
        over time (evaluations and restarts: a handful of points each). The stage boxes use the
        latest values only: a run of 10,000 steps has 10,000 points of actor throughput."""
        if self.mlflow is None or row.mlflow_run_id is None:
            return {}, {}
        try:
            latest = self.mlflow.latest_of_run(row.mlflow_run_id)
            drawn = [key for key in latest if key in (RESTARTS, EVAL_SUCCESS) or _is_in_run_eval(key)]
            return latest, self.mlflow.histories(row.mlflow_run_id, drawn)
        except MlflowUnavailable as error:
            warnings.append(str(error))
            return {}, {}

    def _trainer_records(self, row: RunListRow, run_dir: Path) -> list[dict[str, Any]]:
        """The trainer's records up to the newest version the database has: the file is written first
        and the database a flush later, and one page should not show two different newest steps."""
        newest = row.policy_version if row.policy_version is not None else 0
        return [r for r in self.files.trainer_records(run_dir) if int(r["policy_version"]) <= newest]

    def _run_dir(self, row: RunListRow, versions: Sequence[PolicyVersionRow] | None = None) -> Path | None:
        if versions is None:
            versions = self.database.policy_versions(row.id)
        return run_directory(row.config, row.id, [v.checkpoint_path for v in versions if v.checkpoint_path])

    # -- comparisons ----------------------------------------------------------------------------------

    def compare(self, run_ids: Sequence[str], max_points: int, target: float | None) -> dict[str, Any]:
        """Two or more runs overlaid: their step series and the time-to-target table. A single id of a
        ``compare`` (or ``sweep``) parent stands for its children."""
        rows = [self.database.run(run_id) for run_id in run_ids]
        parent = None
        if len(rows) == 1 and rows[0].mode in COMPARE_KINDS:
            parent = rows[0]
            rows = self.database.children(parent.id)
        labels = _labels(rows)
        warnings: list[str] = []
        compared, series = [], []
        for row, label in zip(rows, labels, strict=True):
            steps = self.database.steps(row.id)
            started = training_started_at(steps, row.started_at)
            compared.append(
                ComparedRun(
                    run_id=row.id,
                    label=label,
                    mode=row.mode,
                    rewards=rewards_of(steps),
                    wall_s=[(s.created_at - started).total_seconds() for s in steps],
                    samples=[s.samples_trained for s in steps],
                    ess=[s.values["ess"] for s in steps],
                    lag_mean=[s.values["lag_mean"] for s in steps],
                    lag_max=[s.values["lag_max"] for s in steps],
                )
            )
            series.append(
                {
                    "run_id": row.id,
                    "label": label,
                    "mode": row.mode,
                    "status": row.status,
                    "steps": step_columns(steps, started, max_points),
                    "evals": eval_series(
                        _evals(self._mlflow_metrics(row, warnings)[1]), trainer_points(steps, started)
                    ),
                }
            )
        return {
            "parent": None if parent is None else parent.id,
            "runs": series,
            "table": comparison_table(compared, target),
            "warnings": warnings,
        }


def _labels(rows: Sequence[RunListRow]) -> list[str]:
    """Each run's label: its mode, with what tells two runs of one mode apart (the id's suffix)."""
    modes = [row.mode for row in rows]
    labels = []
    for row in rows:
        if modes.count(row.mode) == 1:
            labels.append(row.mode)
        else:
            labels.append(f"{row.mode} {row.id.rsplit('-', 1)[-1]}")
    return labels


def _evals(histories: dict[str, list[MetricPoint]]) -> dict[str, list[MetricPoint]]:
    """The histories of held-out evaluations (start and end success, in-run pass@1)."""
    return {key: points for key, points in histories.items() if key == EVAL_SUCCESS or _is_in_run_eval(key)}


def _is_in_run_eval(key: str) -> bool:
    """An in-run evaluation's pass@1 (``eval/<set>/pass_at_1``)."""
    parts = registry.parts_of(registry.EVAL_SET_PASS_AT, key)
    return parts is not None and parts["k"] == "1"


def _by_actor(latest: dict[str, float]) -> list[dict[str, Any]]:
    """Each actor's latest tokens/s and idle fraction, from its ``actor/<k>/...`` metrics."""
    fields = {ACTOR_THROUGHPUT: "tokens_per_s", ACTOR_IDLE: "idle_fraction"}
    actors: dict[int, dict[str, Any]] = {}
    for key, value in latest.items():
        labelled = registry.actor_label(key)
        if labelled is not None and labelled[1] in fields:
            actor_id, name = labelled
            actors.setdefault(actor_id, {registry.ACTOR_ID: actor_id})[fields[name]] = value
    return [actors[actor_id] for actor_id in sorted(actors)]


def _latest_eval(latest: dict[str, float]) -> dict[str, Any] | None:
    in_run = sorted(key for key in latest if _is_in_run_eval(key))
    if in_run:
        return {"name": in_run[0], "value": latest[in_run[0]]}
    if EVAL_SUCCESS in latest:
        return {"name": EVAL_SUCCESS, "value": latest[EVAL_SUCCESS]}
    return None


def _phase(run_dir: Path | None, status: str, now: datetime) -> dict[str, Any] | None:
    """The running run's phase (``platform/run_phase.py``) and for how long it has been in it."""
    phase = read_phase(run_dir) if run_dir is not None and status == "running" else None
    if phase is None:
        return None
    return {"text": phase.text, "for_s": round(max(0.0, now.timestamp() - phase.since), 1)}


def _no_run_dir(row: RunListRow) -> str:
    output_dir = (row.config.get("run") or {}).get("output_dir")
    return (
        f"run directory of {row.id!r} not found (run.output_dir {output_dir!r}, taken from the dashboard's "
        "working directory): lag by position, multi-version sequences and batches ahead are unavailable"
    )
