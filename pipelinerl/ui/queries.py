"""Read-only queries of the platform database for the dashboard.

``PlatformStore`` (``platform/tracking/store.py``) migrates the database when it opens it and
returns whole runs; the dashboard must never write, and must stay fast with many runs of thousands
of steps, so it reads through its own engine with narrow Core queries. Every per-run query filters
on ``run_id`` first, which the primary keys of ``step_stats``, ``policy_versions`` and
``lag_histograms`` (``run_id, version[, lag]``) index; the runs list filters on ``runs`` columns and
aggregates the steps of the listed runs only. ``tests/unit/ui`` checks the query plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, RowMapping, Select, and_, func, select, tuple_

from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.tracking.db import (
    LagHistogram,
    PolicyVersion,
    Run,
    StepStats,
    make_engine,
    parse_url,
    translate_errors,
)

# Statistics derived from a step's columns exactly as the tracker derives them for MLflow (trainer
# tokens/s and idle fraction), by their API field.
DERIVED_COLUMNS = {m.api: m.name for m in registry.METRICS if m.derive is not None and m.api is not None}
TRAINER_TOKENS_PER_S_COLUMN = {name: api for api, name in DERIVED_COLUMNS.items()}[
    registry.TRAINER_TOKENS_PER_S
]
BROADCAST_COLUMN = registry.column_of(registry.WEIGHTS_BROADCAST_MS)
# The run page's step columns, in the order the API returns them: what step_stats keeps, the weight
# broadcast after the step (policy_versions) and the derived statistics.
STEP_COLUMNS = (*registry.stored_fields("step_stats"), BROADCAST_COLUMN, *DERIVED_COLUMNS)


class NotFound(LookupError):
    """What was asked for is not in the platform database (the API's 404); the message says what."""


class RunNotFound(NotFound):
    """No run with this id in the platform database."""


@dataclass(frozen=True, slots=True)
class RunListRow:
    """A run as the runs list shows it: the run row and a digest of its steps."""

    id: str
    name: str
    mode: str
    status: str
    started_at: datetime
    ended_at: datetime | None
    mlflow_run_id: str | None
    prefect_flow_run_id: str | None
    parent_run_id: str | None
    summary: dict[str, Any] | None
    config: dict[str, Any]
    steps: int
    policy_version: int | None
    last_step_at: datetime | None  # when the newest step was recorded
    heartbeat_at: datetime | None  # the launcher's latest heartbeat (every 10 s while it runs)
    reward_mean: float | None  # of the newest step
    ess: float | None  # of the newest step
    lag_max: int | None  # over every step
    trainer_tokens_per_s: float | None  # of the newest step (metric_registry.trainer_tokens_per_s)


@dataclass(frozen=True, slots=True)
class StepRow:
    version: int
    created_at: datetime
    samples_trained: int | None
    values: dict[str, float | None]


@dataclass(frozen=True, slots=True)
class PolicyVersionRow:
    version: int
    created_at: datetime
    samples_trained: int
    tokens_trained: int
    checkpoint_path: str | None
    broadcast_ms: float | None
    pause_ms: float | None


@dataclass(frozen=True, slots=True)
class RunFilter:
    """What the runs list may be narrowed to; None means any."""

    experiment: str | None = None
    mode: str | None = None
    status: str | None = None
    parent_run_id: str | None = None
    limit: int = 100


class PlatformReader:
    """Read-only access to the platform database at ``url`` (never migrates, never writes).

    Every failure to reach or read the database is a ``PlatformDatabaseError`` naming the URL
    (password hidden) and the cause; an unknown run is ``RunNotFound``.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine: Engine = make_engine(read_only_url(url))

    def close(self) -> None:
        self._engine.dispose()

    def ping(self) -> None:
        """Raise ``PlatformDatabaseError`` unless the database answers and has the runs table."""
        self._fetch(select(func.count()).select_from(Run).limit(1))

    # -- runs ---------------------------------------------------------------------------------------

    def experiments(self) -> list[str]:
        rows = self._fetch(select(Run.name).distinct().order_by(Run.name))
        return [row["name"] for row in rows]

    def list_runs(self, run_filter: RunFilter) -> list[RunListRow]:
        """The newest runs first, narrowed by ``run_filter``, each with a digest of its steps."""
        query = select(Run).order_by(Run.started_at.desc(), Run.id.desc()).limit(run_filter.limit)
        if run_filter.experiment is not None:
            query = query.where(Run.name == run_filter.experiment)
        if run_filter.mode is not None:
            query = query.where(Run.mode == run_filter.mode)
        if run_filter.status is not None:
            query = query.where(Run.status == run_filter.status)
        if run_filter.parent_run_id is not None:
            query = query.where(Run.parent_run_id == run_filter.parent_run_id)
        rows = self._fetch(query)
        runs = [dict(row) for row in rows]
        return self._with_step_digest(runs)

    def run(self, run_id: str) -> RunListRow:
        rows = self._fetch(select(Run).where(Run.id == run_id))
        found = [dict(row) for row in rows]
        if not found:
            raise RunNotFound(f"no run {run_id!r} in the platform database")
        return self._with_step_digest(found)[0]

    def children(self, parent_run_id: str) -> list[RunListRow]:
        """The runs of a comparison or sweep, oldest first (the order they were launched in)."""
        query = select(Run).where(Run.parent_run_id == parent_run_id).order_by(Run.started_at, Run.id)
        rows = self._fetch(query)
        runs = [dict(row) for row in rows]
        return self._with_step_digest(runs)

    def _with_step_digest(self, runs: list[dict[str, Any]]) -> list[RunListRow]:
        """Attach each run's step count, newest step and maximum lag (two indexed queries in all)."""
        ids = [run["id"] for run in runs]
        digest: dict[str, dict[str, Any]] = {}
        newest: dict[str, dict[str, Any]] = {}
        if ids:
            aggregate = (
                select(
                    StepStats.run_id,
                    func.count().label("steps"),
                    func.max(StepStats.version).label("version"),
                    func.max(StepStats.lag_max).label("lag_max"),
                )
                .where(StepStats.run_id.in_(ids))
                .group_by(StepStats.run_id)
            )
            rows = self._fetch(aggregate)
            digest = {row["run_id"]: dict(row) for row in rows}
            if digest:
                keys = [(run_id, row["version"]) for run_id, row in digest.items()]
                latest = (
                    select(StepStats, PolicyVersion.broadcast_ms)
                    .outerjoin(PolicyVersion, _same_step())
                    .where(tuple_(StepStats.run_id, StepStats.version).in_(keys))
                )
                rows = self._fetch(latest)
                newest = {row["run_id"]: with_derived(dict(row)) for row in rows}
        return [_run_list_row(run, digest.get(run["id"]), newest.get(run["id"])) for run in runs]

    # -- one run's series -----------------------------------------------------------------------------

    def steps(self, run_id: str, *, first: int | None = None, last: int | None = None) -> list[StepRow]:
        """The steps of a run by policy version (all, or only the ``first`` or the ``last`` few), with
        the samples trained up to each, the weight broadcast after each and the statistics derived
        from them (``DERIVED_COLUMNS``)."""
        query = (
            select(StepStats, PolicyVersion.samples_trained, PolicyVersion.broadcast_ms)
            .outerjoin(PolicyVersion, _same_step())
            .where(StepStats.run_id == run_id)
            .order_by(StepStats.version.desc() if last is not None else StepStats.version)
        )
        limit = last if last is not None else first
        rows = self._fetch(query if limit is None else query.limit(limit))
        if last is not None:
            rows = list(reversed(rows))
        return [
            StepRow(
                version=row["version"],
                created_at=row["created_at"],
                samples_trained=row["samples_trained"],
                values=with_derived({column: row[column] for column in STEP_COLUMNS if column in row}),
            )
            for row in rows
        ]

    def policy_versions(self, run_id: str) -> list[PolicyVersionRow]:
        query = select(PolicyVersion).where(PolicyVersion.run_id == run_id).order_by(PolicyVersion.version)
        rows = self._fetch(query)
        return [
            PolicyVersionRow(
                version=row["version"],
                created_at=row["created_at"],
                samples_trained=row["samples_trained"],
                tokens_trained=row["tokens_trained"],
                checkpoint_path=row["checkpoint_path"],
                broadcast_ms=row["broadcast_ms"],
                pause_ms=row["pause_ms"],
            )
            for row in rows
        ]

    def lag_histogram(self, run_id: str, version: int | None = None) -> tuple[int | None, dict[int, int]]:
        """The token lag histogram of one step (the newest that has one unless ``version`` is given)."""
        if version is None:
            newest = select(func.max(LagHistogram.version).label("version")).where(
                LagHistogram.run_id == run_id
            )
            rows = self._fetch(newest)
            version = next(iter(rows))["version"]
            if version is None:
                return None, {}
        query = (
            select(LagHistogram.lag, LagHistogram.count)
            .where(LagHistogram.run_id == run_id, LagHistogram.version == version)
            .order_by(LagHistogram.lag)
        )
        rows = self._fetch(query)
        return version, {row["lag"]: row["count"] for row in rows}

    # -- helpers --------------------------------------------------------------------------------------

    def _fetch(self, query: Select[Any]) -> Sequence[RowMapping]:
        """The rows of ``query`` as mappings; a database failure is one ``PlatformDatabaseError``."""
        with translate_errors(self.url), self._engine.connect() as connection:
            return connection.execute(query).mappings().all()


def _same_step() -> Any:
    """The policy version a step produced (its samples trained so far, the broadcast after it)."""
    return and_(PolicyVersion.run_id == StepStats.run_id, PolicyVersion.version == StepStats.version)


def with_derived(values: dict[str, Any]) -> dict[str, Any]:
    """A step's columns with ``DERIVED_COLUMNS`` added, derived as the tracker derives them."""
    record = registry.record_of_columns(values)
    return {**values, **{api: registry.derive(name, record) for api, name in DERIVED_COLUMNS.items()}}


def read_only_url(url: str) -> str:
    """A SQLite file opened read-only (SQLite would otherwise create a missing file on connect);
    other URLs as given (the dashboard only ever sends SELECTs)."""
    parsed = parse_url(url)
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return url
    if database.startswith("file:"):
        return url
    return f"sqlite:///file:{database}?mode=ro&uri=true"


def _run_list_row(
    run: dict[str, Any], digest: dict[str, Any] | None, newest: dict[str, Any] | None
) -> RunListRow:
    return RunListRow(
        id=run["id"],
        name=run["name"],
        mode=run["mode"],
        status=run["status"],
        started_at=run["started_at"],
        ended_at=run["ended_at"],
        mlflow_run_id=run["mlflow_run_id"],
        prefect_flow_run_id=run["prefect_flow_run_id"],
        parent_run_id=run["parent_run_id"],
        summary=None if run["summary"] is None else dict(run["summary"]),
        config=dict(run["config"] or {}),
        steps=int(digest["steps"]) if digest else 0,
        policy_version=digest["version"] if digest else None,
        last_step_at=newest["created_at"] if newest else None,
        heartbeat_at=run.get("heartbeat_at"),
        reward_mean=newest["reward_mean"] if newest else None,
        ess=newest["ess"] if newest else None,
        lag_max=digest["lag_max"] if digest else None,
        trainer_tokens_per_s=newest[TRAINER_TOKENS_PER_S_COLUMN] if newest else None,
    )
