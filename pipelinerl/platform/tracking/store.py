"""The platform database's API for the rest of the platform: runs, policy versions, steps, the ledgers.

One ``PlatformStore`` per process that records (the run's tracking owner) or reads (the CLI, the UI).
Every method is one transaction and returns plain frozen dataclasses, never ORM objects, so results
can cross threads and outlive the session.

Writes that a restarted stage may repeat are idempotent: ``record_step`` and ``record_policy_version``
upsert, and ``record_consumed`` inserts each rollout into the ledger at most once and reports the
ones it already held (the trainer must not train those again); the prompt ledger's writes
(``record_handouts``, ``record_outcomes``) keep a row already held as it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, delete, func, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, sessionmaker

from pipelinerl.platform.prompt_records import PromptRecords
from pipelinerl.platform.tracking.db import (
    RUN_STATUSES,
    Base,
    LagHistogram,
    PlatformDatabaseError,
    PolicyVersion,
    PromptHandout,
    PromptOutcome,
    RolloutLedger,
    Run,
    StepStats,
    make_engine,
    translate_errors,
    upgrade,
    utcnow,
)
from pipelinerl.platform.tracking.liveness import HEARTBEAT_STALE_S, Liveness
from pipelinerl.platform.tracking.metric_registry import stored_fields
from pipelinerl.platform.tracking.prompt_ledger import read_prompt_records

FINISHED_STATUSES = tuple(status for status in RUN_STATUSES if status != "running")
# Rows per INSERT statement: far below SQLite's 32,766 and PostgreSQL's 65,535 bound parameters.
INSERT_CHUNK_ROWS = 1000
# Most candidates an ambiguous run-id prefix names in its error.
AMBIGUOUS_CANDIDATES_SHOWN = 10

# step_stats column -> the key of the trainer's per-step record (metrics.jsonl) that fills it.
STEP_STAT_KEYS: dict[str, str] = stored_fields("step_stats")
INTEGER_STEP_STATS = frozenset({"lag_max", "tokens", "samples"})


@dataclass(frozen=True, slots=True)
class RunRow:
    """A run as listed: its fields and how many optimizer steps it recorded."""

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
    steps: int
    heartbeat_at: datetime | None = None  # the launcher's latest sign of life (running runs)
    run_dir: str | None = None  # the run directory, absolute (None: recorded before it was kept)
    launcher: dict[str, Any] | None = None  # the launcher process (tracking/liveness.py)

    @property
    def duration_s(self) -> float:
        """Seconds from start to end; for a run still running, to now."""
        return ((self.ended_at or utcnow()) - self.started_at).total_seconds()


@dataclass(frozen=True, slots=True)
class PolicyVersionRow:
    version: int
    samples_trained: int
    tokens_trained: int
    created_at: datetime
    checkpoint_path: str | None
    broadcast_ms: float | None
    pause_ms: float | None


@dataclass(frozen=True, slots=True)
class StepStatsRow:
    version: int
    loss: float | None
    reward_mean: float | None
    ess: float | None
    lag_mean: float | None
    lag_p50: float | None
    lag_p90: float | None
    lag_max: int | None
    tokens: int | None
    samples: int | None
    step_s: float | None
    wait_s: float | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class RunDetail:
    """One run with its configuration, policy versions, step statistics and lag histograms."""

    run: RunRow
    config: dict[str, Any]
    policy_versions: tuple[PolicyVersionRow, ...]
    steps: tuple[StepStatsRow, ...]
    lag_histograms: dict[int, dict[int, int]] = field(default_factory=dict)


class PlatformStore:
    """Typed access to the platform database at ``url``; the schema is upgraded to head on construction."""

    def __init__(self, url: str, *, migrate: bool = True) -> None:
        """``migrate=False``: use the schema as it is (a reader that writes little, such as the
        dashboard, must not run Alembic in a process where another library may be migrating: Alembic's
        ``context`` is one per process, and MLflow migrates its own store with it)."""
        self.url = url
        if migrate:
            upgrade(url)
        self._engine = make_engine(url)
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> PlatformStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- runs -------------------------------------------------------------------------------------

    def create_run(
        self,
        run_id: str,
        name: str,
        mode: str,
        config: Mapping[str, Any],
        started_at: datetime,
        mlflow_run_id: str | None = None,
        prefect_flow_run_id: str | None = None,
        parent_run_id: str | None = None,
        run_dir: str | None = None,
        launcher: Mapping[str, Any] | None = None,
    ) -> None:
        """Record a new run with status ``running``; its id must be new, its parent (if any) known.
        ``run_dir`` and ``launcher`` (``liveness.this_process()``) let a crash be seen and caught up."""
        with self._transaction() as session:
            if session.get(Run, run_id) is not None:
                raise ValueError(f"run {run_id!r} already exists in the platform database")
            if parent_run_id is not None and session.get(Run, parent_run_id) is None:
                raise LookupError(
                    f"parent run {parent_run_id!r} of run {run_id!r} is not in the platform database"
                )
            session.add(
                Run(
                    id=run_id,
                    name=name,
                    mode=mode,
                    config=dict(config),
                    status="running",
                    started_at=started_at,
                    ended_at=None,
                    heartbeat_at=started_at,
                    mlflow_run_id=mlflow_run_id,
                    prefect_flow_run_id=prefect_flow_run_id,
                    parent_run_id=parent_run_id,
                    summary=None,
                    run_dir=run_dir,
                    launcher=None if launcher is None else dict(launcher),
                )
            )

    def finish_run(
        self, run_id: str, status: str, ended_at: datetime, summary: Mapping[str, Any] | None = None
    ) -> None:
        """Mark a run finished, failed or killed; a summary given replaces the stored one."""
        if status not in FINISHED_STATUSES:
            raise ValueError(
                f"run status {status!r} is not a final status; valid: {', '.join(FINISHED_STATUSES)}"
            )
        values: dict[str, Any] = {"status": status, "ended_at": ended_at}
        if summary is not None:
            values["summary"] = dict(summary)
        self._update_run(run_id, values)

    def reopen_run(self, run_id: str, at: datetime, launcher: Mapping[str, Any] | None) -> None:
        """A run resumed in place (``pipelinerl resume``) is ``running`` again, under its new launcher;
        its summary, if any, was of the attempt that ended."""
        self._update_run(
            run_id,
            {
                "status": "running",
                "ended_at": None,
                "heartbeat_at": at,
                "summary": None,
                "launcher": None if launcher is None else dict(launcher),
            },
        )

    def heartbeat(self, run_id: str, at: datetime) -> None:
        """The run's launcher is alive at ``at`` (only a running run's heartbeat moves)."""
        with self._transaction() as session:
            session.execute(
                update(Run).where(Run.id == run_id, Run.status == "running").values(heartbeat_at=at)
            )

    def mark_silent_runs_crashed(
        self,
        now: datetime,
        stale_after_s: float = HEARTBEAT_STALE_S,
        liveness: Callable[[Mapping[str, Any] | None], Liveness] = lambda launcher: "unknown",
    ) -> list[RunRow]:
        """Runs still ``running`` whose launcher is gone become ``crashed``, ended at their last
        heartbeat; returns them (as they are now). ``liveness`` judges a run's launcher
        (``liveness.liveness_here``): "gone" is a crash at once, "alive" never is, "unknown" is one when
        the heartbeat stopped more than ``stale_after_s`` before ``now``."""
        cutoff = now - timedelta(seconds=stale_after_s)
        with self._transaction() as session:
            running = session.scalars(select(Run).where(Run.status == "running")).all()
            silent = []
            for run in running:
                state = liveness(run.launcher)
                last_sign = run.heartbeat_at or run.started_at
                if state == "gone" or (state == "unknown" and last_sign < cutoff):
                    silent.append(run)
            for run in silent:
                run.status = "crashed"
                run.ended_at = run.heartbeat_at or run.started_at
            ids = [run.id for run in silent]
        if not ids:
            return []
        with self._transaction() as session:
            query = _runs_with_steps().where(Run.id.in_(ids)).order_by(Run.started_at)
            return [_run_row(run, steps) for run, steps in session.execute(query).tuples()]

    def set_mlflow_run_id(self, run_id: str, mlflow_run_id: str) -> None:
        self._update_run(run_id, {"mlflow_run_id": mlflow_run_id})

    def list_runs(self, limit: int = 50) -> list[RunRow]:
        """The most recently started runs first."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        with self._transaction() as session:
            query = _runs_with_steps().order_by(Run.started_at.desc(), Run.id.desc()).limit(limit)
            return [_run_row(run, steps) for run, steps in session.execute(query).tuples()]

    def child_runs(self, parent_run_id: str) -> list[RunRow]:
        """The runs started under ``parent_run_id`` (a comparison's modes, a sweep's points), in order."""
        with self._transaction() as session:
            query = (
                _runs_with_steps().where(Run.parent_run_id == parent_run_id).order_by(Run.started_at, Run.id)
            )
            return [_run_row(run, steps) for run, steps in session.execute(query).tuples()]

    def find_run_id(self, run_id_or_prefix: str) -> str:
        """The id of the run named exactly, else of the one run whose id starts with the prefix;
        LookupError, naming the value, if none or several match."""
        with self._transaction() as session:
            return _resolve_run_id(session, run_id_or_prefix)

    def get_run(self, run_id_or_prefix: str) -> RunDetail:
        """A run by its id or a unique prefix of it; LookupError if none or several match."""
        with self._transaction() as session:
            run_id = _resolve_run_id(session, run_id_or_prefix)
            run, steps_count = session.execute(_runs_with_steps().where(Run.id == run_id)).tuples().one()
            versions = session.scalars(
                select(PolicyVersion).where(PolicyVersion.run_id == run_id).order_by(PolicyVersion.version)
            )
            steps = session.scalars(
                select(StepStats).where(StepStats.run_id == run_id).order_by(StepStats.version)
            )
            histograms: dict[int, dict[int, int]] = {}
            for row in session.scalars(
                select(LagHistogram)
                .where(LagHistogram.run_id == run_id)
                .order_by(LagHistogram.version, LagHistogram.lag)
            ):
                histograms.setdefault(row.version, {})[row.lag] = row.count
            return RunDetail(
                run=_run_row(run, steps_count),
                config=dict(run.config),
                policy_versions=tuple(
                    PolicyVersionRow(
                        version=v.version,
                        samples_trained=v.samples_trained,
                        tokens_trained=v.tokens_trained,
                        created_at=v.created_at,
                        checkpoint_path=v.checkpoint_path,
                        broadcast_ms=v.broadcast_ms,
                        pause_ms=v.pause_ms,
                    )
                    for v in versions
                ),
                steps=tuple(
                    StepStatsRow(
                        version=s.version,
                        **{column: getattr(s, column) for column in STEP_STAT_KEYS},
                        created_at=s.created_at,
                    )
                    for s in steps
                ),
                lag_histograms=histograms,
            )

    # -- per-step records -------------------------------------------------------------------------

    def record_step(
        self,
        run_id: str,
        version: int,
        stats: Mapping[str, Any],
        lag_histogram: Mapping[int, int] | Sequence[int],
        created_at: datetime | None = None,
    ) -> None:
        """Store the statistics and lag histogram of the step that produced ``version``.

        ``stats`` is the trainer's per-step record (``rl/loss``, ``rl/ess``, ``lag/mean``,
        ``trainer/tokens``, ``trainer/step_s`` ..., see ``STEP_STAT_KEYS``; the tracker renames a record
        written before the renames first) or a dict keyed by the column names; other keys
        are ignored (the full record lives in ``metrics.jsonl`` and MLflow). ``lag_histogram`` maps a
        lag to its token count, or is a list whose entry k counts lag k; zero counts are not stored.
        Recording a version again replaces what was stored for it.
        """
        values = {"run_id": run_id, "version": version, "created_at": created_at or utcnow()}
        for column, record_key in STEP_STAT_KEYS.items():
            value = stats.get(record_key, stats.get(column))
            if value is not None:
                value = int(value) if column in INTEGER_STEP_STATS else float(value)
            values[column] = value
        counts = lag_histogram.items() if isinstance(lag_histogram, Mapping) else enumerate(lag_histogram)
        histogram_rows = [
            {"run_id": run_id, "version": version, "lag": int(lag), "count": int(count)}
            for lag, count in counts
            if count
        ]
        with self._transaction() as session:
            self._require_run(session, run_id)
            statement = _insert(session, StepStats).values(values)
            statement = statement.on_conflict_do_update(
                index_elements=["run_id", "version"],
                set_={
                    column: statement.excluded[column]
                    for column in values
                    if column not in ("run_id", "version")
                },
            )
            session.execute(statement)
            session.execute(
                delete(LagHistogram).where(LagHistogram.run_id == run_id, LagHistogram.version == version)
            )
            for chunk in _chunks(histogram_rows):
                session.execute(_insert(session, LagHistogram).values(chunk))

    def record_policy_version(
        self,
        run_id: str,
        version: int,
        samples_trained: int,
        tokens_trained: int,
        created_at: datetime,
        checkpoint_path: str | None = None,
        broadcast_ms: float | None = None,
        pause_ms: float | None = None,
    ) -> None:
        """Store a policy version; recording it again updates it, a field given as None keeps its value."""
        values: dict[str, Any] = {
            "run_id": run_id,
            "version": version,
            "samples_trained": int(samples_trained),
            "tokens_trained": int(tokens_trained),
            "created_at": created_at,
            "checkpoint_path": None if checkpoint_path is None else str(checkpoint_path),
            "broadcast_ms": None if broadcast_ms is None else float(broadcast_ms),
            "pause_ms": None if pause_ms is None else float(pause_ms),
        }
        with self._transaction() as session:
            self._require_run(session, run_id)
            statement = _insert(session, PolicyVersion).values(values)
            statement = statement.on_conflict_do_update(
                index_elements=["run_id", "version"],
                set_={
                    column: func.coalesce(statement.excluded[column], PolicyVersion.__table__.c[column])
                    for column in values
                    if column not in ("run_id", "version")
                },
            )
            session.execute(statement)

    # -- the rollout ledger -----------------------------------------------------------------------

    def record_consumed(
        self,
        run_id: str,
        entries: Iterable[tuple[str, int, int]],
        consumed_at: datetime | None = None,
    ) -> list[str]:
        """Enter ``(rollout_id, produced_by_version, consumed_at_version)`` rollouts into the ledger.

        Returns, in the order given, the ids the ledger already held before this call: those were
        trained before and must not be trained again. Only new ids are inserted, all in one
        transaction, and concurrent callers cannot both insert the same id. An id repeated within
        ``entries`` is entered once (its first entry) and not reported.
        """
        consumed_at = consumed_at or utcnow()
        rows: dict[str, dict[str, Any]] = {}
        for rollout_id, produced_by_version, consumed_at_version in entries:
            rows.setdefault(
                rollout_id,
                {
                    "run_id": run_id,
                    "rollout_id": rollout_id,
                    "produced_by_version": int(produced_by_version),
                    "consumed_at_version": int(consumed_at_version),
                    "consumed_at": consumed_at,
                },
            )
        inserted: set[str] = set()
        with self._transaction() as session:
            self._require_run(session, run_id)
            for chunk in _chunks(list(rows.values())):
                statement = (
                    _insert(session, RolloutLedger)
                    .values(chunk)
                    .on_conflict_do_nothing(index_elements=["run_id", "rollout_id"])
                    .returning(RolloutLedger.rollout_id)
                )
                inserted.update(session.scalars(statement))
        return [rollout_id for rollout_id in rows if rollout_id not in inserted]

    def discard_after(self, run_id: str, version: int) -> int:
        """Forget every version of ``run_id`` after ``version``: a restart resumed from the checkpoint
        at ``version`` and the policies that held them are gone. Their step statistics, lag histograms,
        policy versions and prompt outcomes are deleted, and their rollouts leave the ledger (the
        surviving policy was not trained on them); the prompts handed out stay. Returns how many ledger
        entries went."""
        with self._transaction() as session:
            self._require_run(session, run_id)
            for table in (StepStats, LagHistogram, PolicyVersion, PromptOutcome):
                session.execute(delete(table).where(table.run_id == run_id, table.version > version))
            result = session.execute(
                delete(RolloutLedger).where(
                    RolloutLedger.run_id == run_id, RolloutLedger.consumed_at_version > version
                )
            )
            return int(getattr(result, "rowcount", 0) or 0)

    def recorded_versions(self, run_id: str) -> set[int]:
        """The versions whose step statistics the database holds for ``run_id``."""
        with self._transaction() as session:
            return set(session.scalars(select(StepStats.version).where(StepStats.run_id == run_id)))

    def consumed_ids(self, run_id: str) -> set[str]:
        """Every rollout id the ledger holds for ``run_id``."""
        with self._transaction() as session:
            return set(
                session.scalars(select(RolloutLedger.rollout_id).where(RolloutLedger.run_id == run_id))
            )

    # -- the prompt ledger (prompt_ledger.py) -----------------------------------------------------

    def record_handouts(self, run_id: str, rows: Iterable[Mapping[str, Any]]) -> int:
        """Enter hand-outs (``prompt_ledger.handout_row``), in one transaction; one the ledger already
        holds is left as it is. Returns how many were new."""
        return self._insert_new(run_id, PromptHandout, rows, ("group_id", "started_at"))

    def record_outcomes(self, run_id: str, rows: Iterable[Mapping[str, Any]]) -> int:
        """Enter what became of groups (``prompt_ledger.drop_row``, ``trained_rows``), in one
        transaction; one the ledger already holds is left as it is. Returns how many were new."""
        return self._insert_new(run_id, PromptOutcome, rows, ("group_id", "version", "outcome", "reason"))

    def prompt_records(self, run_id: str) -> PromptRecords:
        """The prompt ledger of ``run_id`` as ``pipelinerl runs audit`` reads it (hand-outs by actor,
        trained groups by prompt, drops, and the surviving lineage's versions)."""
        with self._transaction() as session:
            self._require_run(session, run_id)
            return read_prompt_records(session, run_id)

    # -- helpers ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on any error."""
        with translate_errors(self.url), self._sessions.begin() as session:
            yield session

    def _update_run(self, run_id: str, values: dict[str, Any]) -> None:
        with self._transaction() as session:
            result = session.execute(update(Run).where(Run.id == run_id).values(**values))
            if result.rowcount == 0:  # type: ignore[attr-defined]
                raise LookupError(f"no run {run_id!r} in the platform database")

    def _insert_new(
        self, run_id: str, entity: type[Base], rows: Iterable[Mapping[str, Any]], key: tuple[str, ...]
    ) -> int:
        """Insert the rows whose key (after ``run_id``) the table lacks; a key repeated in ``rows``
        is inserted once (its first row)."""
        unique: dict[tuple[Any, ...], dict[str, Any]] = {}
        for row in rows:
            unique.setdefault(tuple(row[column] for column in key), {**row, "run_id": run_id})
        new = 0
        with self._transaction() as session:
            self._require_run(session, run_id)
            for chunk in _chunks(list(unique.values())):
                result = session.execute(_insert(session, entity).values(chunk).on_conflict_do_nothing())
                new += int(getattr(result, "rowcount", 0) or 0)
        return new

    @staticmethod
    def _require_run(session: Session, run_id: str) -> None:
        if session.get(Run, run_id) is None:
            raise LookupError(f"no run {run_id!r} in the platform database")


def _insert(session: Session, entity: type[Base]) -> Any:
    """The backend's INSERT, which has ``on_conflict_do_update`` / ``on_conflict_do_nothing``."""
    backend = session.get_bind().dialect.name
    if backend == "postgresql":
        return postgresql_insert(entity)
    if backend == "sqlite":
        return sqlite_insert(entity)
    raise PlatformDatabaseError(f"unsupported database backend {backend!r}; use SQLite or PostgreSQL")


def _chunks(rows: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, len(rows), INSERT_CHUNK_ROWS):
        yield rows[start : start + INSERT_CHUNK_ROWS]


def _runs_with_steps() -> Select[tuple[Run, int]]:
    """Runs, each with the number of steps it recorded."""
    steps = (
        select(StepStats.run_id, func.count().label("steps"))
        .group_by(StepStats.run_id)
        .subquery("step_counts")
    )
    return select(Run, func.coalesce(steps.c.steps, 0)).outerjoin(steps, steps.c.run_id == Run.id)


def _run_row(run: Run, steps: int) -> RunRow:
    return RunRow(
        id=run.id,
        name=run.name,
        mode=run.mode,
        status=run.status,
        started_at=run.started_at,
        ended_at=run.ended_at,
        mlflow_run_id=run.mlflow_run_id,
        prefect_flow_run_id=run.prefect_flow_run_id,
        parent_run_id=run.parent_run_id,
        summary=None if run.summary is None else dict(run.summary),
        steps=int(steps),
        heartbeat_at=run.heartbeat_at,
        run_dir=run.run_dir,
        launcher=None if run.launcher is None else dict(run.launcher),
    )


def _resolve_run_id(session: Session, run_id_or_prefix: str) -> str:
    """The id of the run named exactly, else of the one run whose id starts with the prefix."""
    if not run_id_or_prefix:
        raise LookupError("no run id given")
    if session.get(Run, run_id_or_prefix) is not None:
        return run_id_or_prefix
    candidates = list(
        session.scalars(
            select(Run.id)
            .where(Run.id.startswith(run_id_or_prefix, autoescape=True))
            .order_by(Run.id)
            .limit(AMBIGUOUS_CANDIDATES_SHOWN + 1)
        )
    )
    if not candidates:
        raise LookupError(f"no run {run_id_or_prefix!r} in the platform database")
    if len(candidates) > 1:
        shown = ", ".join(candidates[:AMBIGUOUS_CANDIDATES_SHOWN])
        more = " and more" if len(candidates) > AMBIGUOUS_CANDIDATES_SHOWN else ""
        raise LookupError(f"run id prefix {run_id_or_prefix!r} is ambiguous: it matches {shown}{more}")
    return candidates[0]
