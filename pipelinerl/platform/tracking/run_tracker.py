"""The run tracker: one MLflow run per ``pipelinerl run``, and the platform database, from one owner.

Stages never talk to MLflow: they append records to JSON-lines files (``platform/jsonl.py``); the
launcher process hands each new record to a ``RunTracker``, whose background thread writes them
in batches (``log_batch``) every ``tracking.flush_interval_s`` seconds. A slow or unreachable
server therefore delays the charts, never a stage.

Metric names are declared in ``metric_registry``; ``step`` is always the policy version. What the
tracker records:

* params: the whole resolved config, flattened (``run.mode``, ``rl.batch_size``, ...);
* tags: mode, task, model, git commit, Prefect flow-run id (when there is one), parent run;
* metrics per optimizer step from the trainer, per weight update from each actor (all actors under
  the plain names, each under ``actor/<k>/...``), per batch from the preprocessor, and held-out
  success when evaluated;
* figures (``platform/tracking/figures.py``) every ``tracking.figures_every`` versions and at the end;
* checkpoints as MLflow logged models carrying the policy version, samples trained and location;
* the platform database: the run row, per-step statistics, lag histograms, policy versions, the
  rollout ledger (a rollout trained twice is counted in ``ledger/duplicates``) and the prompt ledger
  (``prompt_ledger.py``: the actors' hand-outs, the drops, and the groups each step trained).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.restart_records import Discarded
from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.tracking.db import database_url
from pipelinerl.platform.tracking.liveness import HEARTBEAT_S, this_process
from pipelinerl.platform.tracking.metrics import (
    actor_metrics,
    all_actors_metrics,
    eval_metrics,
    preprocessor_metrics,
    trainer_metrics,
)
from pipelinerl.platform.tracking.mlflow_store import (
    MLFLOW_STATUS,
    CheckpointRecord,
    MetricPoint,
    MlflowStore,
    TrackingError,
    artifact_root,
    mlflow_uri,
    param_items,
    run_tags,
)
from pipelinerl.platform.tracking.prompt_ledger import drop_row, handout_row, trained_rows
from pipelinerl.platform.tracking.store import PlatformStore

logger = logging.getLogger("pipelinerl.tracking")

# Most prompt-ledger rows one write (one transaction) takes; the rest go in the next one.
PROMPT_ROWS_PER_WRITE = 5000

# ----- the owner -----


@dataclass
class TrackedRun:
    """What the owner has seen of the run so far (for figures and the final summary)."""

    trainer_records: list[dict[str, Any]] = field(default_factory=list)
    evals: list[tuple[float, float]] = field(default_factory=list)  # (wall_s, success)
    duplicates: int = 0
    # Policy-version fields that may arrive before the trainer's record of that version.
    versions: dict[int, dict[str, Any]] = field(default_factory=dict)
    pending: dict[int, dict[str, Any]] = field(default_factory=dict)
    actors: dict[int, dict[str, Any]] = field(default_factory=dict)  # each actor's latest record


def unreachable(error: BaseException) -> bool:
    """Whether a store error means the store could not be reached (a connection refused, reset or
    timed out), rather than a store that answered and refused the write (permissions, a bad
    artifact location): the two need different actions, so the warning says which."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__
        if isinstance(current, ConnectionError | TimeoutError) or any(
            word in name for word in ("Connection", "Timeout", "MaxRetry")
        ):
            return True
        text = str(current).lower()
        if any(phrase in text for phrase in ("connection refused", "could not connect", "max retries")):
            return True
        current = current.__cause__ or current.__context__
    return False


@dataclass
class PromptRows:
    """One pending write of prompt-ledger rows (hand-outs or outcomes): records arriving in a row
    join it until it is written, so a run's thousands of hand-outs take a few transactions."""

    table: str  # "handouts" or "outcomes"
    record: Callable[[list[dict[str, Any]]], object]  # the store's method that writes them
    rows: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self) -> None:
        self.record(self.rows)


class RunTracker:
    """Writes one run to MLflow and the platform database from a background thread.

    ``start`` (synchronous: a store that cannot be reached fails the run before any stage starts),
    then ``trainer_records`` / ``actor_records`` / ``preprocessor_records`` / ``handout_records`` /
    ``drop_records`` / ``evaluated`` as data arrives (they only enqueue), then ``finish``.
    """

    def __init__(
        self,
        config: PipelineConfig,
        run_id: str,
        *,
        parent_mlflow_run_id: str | None = None,
        parent_run_id: str | None = None,
        prefect_flow_run_id: str | None = None,
        run_dir: Path | None = None,
        label: str | None = None,
    ) -> None:
        self.config = config
        self.run_id = run_id
        self.label = label  # the MLflow run's name (default: the mode under a parent, else the run id)
        self.run_dir = run_dir
        self.parent_run_id = parent_run_id
        self.parent_mlflow_run_id = parent_mlflow_run_id
        self.prefect_flow_run_id = prefect_flow_run_id
        self.mlflow: MlflowStore | None = None
        self.mlflow_run_id: str | None = None
        self.store: Any = None  # PlatformStore
        self.seen = TrackedRun()
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_figures_version = 0
        self._points: list[MetricPoint] = []  # the outbox: metric points and writes not yet stored
        self._writes: list[Callable[[], object]] = []
        self._outage = False
        self.failures = 0

    # --- lifecycle ---

    def start(self, model_path: Path, started_at: float) -> str:
        """Create the MLflow run and the database row; returns the MLflow run id."""
        config = self.config
        if mlflow_uri(config) == database_url(config):
            raise TrackingError(
                f"the MLflow store and the platform database are both {mlflow_uri(config)!r}; they need "
                "separate databases (both have a table named runs): set tracking.database_url or "
                "tracking.mlflow_uri to another one"
            )
        # Both stores are reached before anything is created in either: no orphan run on failure.
        self.store = PlatformStore(database_url(config))
        self.mlflow = MlflowStore(mlflow_uri(config), artifact_root(config))
        self.mlflow_run_id = self.mlflow.start_run(
            config.run.name,
            # A comparison's children are told apart in MLflow's chart view by what they are.
            self.label or (config.mode_label() if self.parent_mlflow_run_id else self.run_id),
            run_tags(config, model_path, self.prefect_flow_run_id),
            self.parent_mlflow_run_id,
        )
        self.mlflow.log_params(self.mlflow_run_id, param_items(config))
        self.store.create_run(
            self.run_id,
            name=config.run.name,
            mode=config.run.mode,
            config=config.model_dump(mode="json"),
            started_at=datetime.fromtimestamp(started_at, UTC),
            mlflow_run_id=self.mlflow_run_id,
            prefect_flow_run_id=self.prefect_flow_run_id,
            parent_run_id=self.parent_run_id,
            run_dir=None if self.run_dir is None else str(self.run_dir.resolve()),
            launcher=this_process(),
        )
        self._start_threads()
        return self.mlflow_run_id

    def _start_threads(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="tracking", daemon=True)
        self._thread.start()
        # Its own thread: a flush held up by a slow or unreachable store must not silence the beats.
        self._beats = threading.Thread(target=self._beat_loop, name="tracking-heartbeat", daemon=True)
        self._beats.start()

    def reopen(self, mlflow_run_id: str) -> None:
        """Track a run both stores already hold, resumed in place (``pipelinerl resume``): the MLflow run
        and the database row are running again, under this process; the records come as for a new run."""
        config = self.config
        self.store = PlatformStore(database_url(config))
        self.mlflow = MlflowStore(mlflow_uri(config), artifact_root(config))
        self.mlflow_run_id = mlflow_run_id
        self.mlflow.reopen_run(mlflow_run_id)
        self.store.reopen_run(self.run_id, datetime.now(UTC), this_process())
        self._start_threads()

    @classmethod
    def attach(
        cls,
        config: PipelineConfig,
        run_id: str,
        store: Any,
        mlflow: MlflowStore | None,
        mlflow_run_id: str | None,
    ) -> RunTracker:
        """A tracker over a run both stores already hold, whose records are written by ``write``
        (no thread, no heartbeat): how the stores catch up with a run whose launcher died
        (``catch_up.py``). Without ``mlflow`` only the platform database is written."""
        tracker = cls(config, run_id)
        tracker.store, tracker.mlflow, tracker.mlflow_run_id = store, mlflow, mlflow_run_id
        return tracker

    def write(self, records: Sequence[tuple[str, dict[str, Any]]]) -> bool:
        """Turn ``(kind, record)`` pairs (kinds: trainer, actor, preprocessor, eval_round, handout (a
        hand-out with its ``actor_id``), dropped) into rows and points exactly as a live run does, and
        write them now; True once every store took them."""
        for kind, record in records:
            self._process(kind, record)
        if self.mlflow is None:
            self._points.clear()
        return self._flush()

    def finish(self, status: str, summary: dict[str, Any] | None = None) -> None:
        """Flush everything, log the final figures and summary, and close the run as ``status``.

        If the stores are unreachable, retries for ``tracking.final_flush_timeout_s`` and then
        gives up, saying what was not written (the run directory still holds every record).
        """
        if self.mlflow is None or self.mlflow_run_id is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        mlflow, run_id = self.mlflow, self.mlflow_run_id
        self._writes.append(self._log_figures)
        if summary is not None:
            self._writes.append(lambda: mlflow.log_dict(run_id, summary, "summary.json"))
            self._points.extend(
                MetricPoint(registry.summary_name(key), float(value), 0, time.time())
                for key, value in summary.items()
                if isinstance(value, int | float) and not isinstance(value, bool)
            )
        self._writes.append(lambda: mlflow.end_run(run_id, MLFLOW_STATUS[status]))
        self._writes.append(
            lambda: self.store.finish_run(
                self.run_id, status=status, ended_at=datetime.now(UTC), summary=summary
            )
        )
        deadline = time.monotonic() + self.config.tracking.final_flush_timeout_s
        while not self._flush():
            if time.monotonic() >= deadline:
                logger.error(
                    "tracking: %d items could not be written to %s before giving up; the run directory "
                    "keeps every record",
                    self.outbox_size,
                    self.mlflow.uri,
                )
                return
            time.sleep(min(2.0, self.config.tracking.flush_interval_s))

    # --- data in (called from the launcher's supervise loop; never blocks) ---

    def trainer_records(self, records: Sequence[dict[str, Any]]) -> None:
        for record in records:
            self._queue.put(("trainer", record))

    def actor_records(self, records: Sequence[dict[str, Any]]) -> None:
        for record in records:
            self._queue.put(("actor", record))

    def preprocessor_records(self, records: Sequence[dict[str, Any]]) -> None:
        for record in records:
            self._queue.put(("preprocessor", record))

    def eval_records(self, records: Sequence[dict[str, Any]]) -> None:
        """In-run evaluations (``eval.jsonl``): ``eval/<set>/...`` at the version each measured."""
        for record in records:
            self._queue.put(("eval_round", record))

    def handout_records(self, actor_id: int, records: Sequence[dict[str, Any]]) -> None:
        """Actor ``actor_id``'s hand-outs (``prompts/actor<k>.jsonl``): the prompt ledger."""
        for record in records:
            self._queue.put(("handout", {**record, registry.ACTOR_ID: actor_id}))

    def drop_records(self, records: Sequence[dict[str, Any]]) -> None:
        """Drops of groups by the preprocessor or a trainer rank (``prompts/``): the prompt ledger."""
        for record in records:
            self._queue.put(("dropped", record))

    def evaluated(self, policy_version: int, success: float, wall_s: float) -> None:
        self._queue.put(("eval", (policy_version, success, wall_s)))

    def checkpoint(self, checkpoint: CheckpointRecord) -> None:
        self._queue.put(("checkpoint", checkpoint))

    def predicted(self, prediction: dict[str, Any], metrics: dict[str, float], at_version: int) -> None:
        """The simulator's prediction of the run beside what it measured (``run.plan_profile``): its
        ``plan/...`` metrics at ``at_version``, and the whole as the artifact ``plan_prediction.json``."""
        self._queue.put(("plan", (prediction, metrics, at_version)))

    def restarted(self, restarts: int, discarded: Discarded) -> None:
        """The stages were started again (``run.max_restarts``), the ``restarts``-th time, from the
        checkpoint at ``discarded.resumed_from_version``; the versions after it are discarded."""
        self._queue.put(("restart", (restarts, discarded)))

    # --- the background thread ---
    #
    # Each record is turned, once, into metric points and "writes" (database rows, logged models);
    # both wait in an outbox until the stores take them. If a store is down, the outbox keeps them
    # (the run goes on) and the next flush retries, in order; nothing is written twice.

    def _loop(self) -> None:
        while not self._stop.wait(self.config.tracking.flush_interval_s):
            self._flush()
            every = self.config.tracking.figures_every
            records = self.seen.trainer_records
            newest = records[-1][registry.POLICY_VERSION] if records else 0
            if every and newest - self._last_figures_version >= every:
                self._last_figures_version = newest
                self._writes.append(self._log_figures)

    def _beat_loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self._beat()

    def _beat(self) -> None:
        """The run's heartbeat in the platform database (HEARTBEAT_S); a database that is down misses
        beats, which the outage warning already reports, and the next beat catches up."""
        try:
            self.store.heartbeat(self.run_id, datetime.now(UTC))
        except Exception as error:  # tracking must not take the run down
            logger.debug("tracking: heartbeat not written (%s)", error)

    @property
    def outbox_size(self) -> int:
        return len(self._points) + len(self._writes)

    def _flush(self) -> bool:
        """Process new records and try to empty the outbox; True when it is empty."""
        while True:
            try:
                kind, payload = self._queue.get_nowait()
            except queue.Empty:
                break
            self._process(kind, payload)
        if not self.outbox_size:
            return True
        try:
            while self._writes:
                self._writes[0]()
                self._writes.pop(0)
            if self.mlflow is not None and self.mlflow_run_id is not None:
                self.mlflow.log_metrics(self.mlflow_run_id, self._points)
            self._points.clear()
        except Exception as error:  # tracking must not take the run down: keep the outbox, say so
            self.failures += 1
            if not self._outage:
                logger.warning(
                    "%s (%s): %s; training goes on, %d items buffered",
                    "tracking store unreachable" if unreachable(error) else "tracking store refused a write",
                    type(error).__name__,
                    str(error).splitlines()[0][:200] if str(error) else "",
                    self.outbox_size,
                )
            self._outage = True
            return False
        if self._outage:
            logger.warning("tracking store reachable again; buffered items written")
            self._outage = False
        return True

    def _process(self, kind: str, payload: Any) -> None:
        if kind == "trainer":
            self._trainer_record(payload)
        elif kind == "actor":
            self._actor_record(payload)
        elif kind == "preprocessor":
            for key, value in preprocessor_metrics(payload).items():
                self._points.append(
                    MetricPoint(key, value, int(payload[registry.STEP]), payload[registry.TIME])
                )
        elif kind == "eval":
            version, success, wall_s = payload
            self.seen.evals.append((wall_s, success))
            self._points.append(MetricPoint(registry.EVAL_SUCCESS, success, version, time.time()))
        elif kind == "eval_round":
            for key, value in eval_metrics(payload).items():
                self._points.append(
                    MetricPoint(key, value, int(payload[registry.POLICY_VERSION]), payload[registry.TIME])
                )
        elif kind == "handout":
            self._prompt_row("handouts", handout_row(int(payload[registry.ACTOR_ID]), payload))
        elif kind == "dropped":
            if (row := drop_row(payload)) is not None:
                self._prompt_row("outcomes", row)
        elif kind == "restart":
            self._restart(*payload)
        elif kind == "plan":
            prediction, metrics, version = payload
            now = time.time()
            self._points.extend(MetricPoint(key, value, version, now) for key, value in metrics.items())
            store, mlflow_run = self.mlflow, self.mlflow_run_id
            if store is not None and mlflow_run is not None:
                self._writes.append(lambda: store.log_dict(mlflow_run, prediction, "plan_prediction.json"))
        elif kind == "checkpoint":
            mlflow, run_id, name = self.mlflow, self.mlflow_run_id, self.config.run.name
            if mlflow is not None and run_id is not None:
                self._writes.append(lambda: mlflow.log_checkpoint(run_id, name, payload))
            self._policy_version(payload.policy_version, checkpoint_path=payload.path)

    def _prompt_row(self, table: str, row: dict[str, Any]) -> None:
        """Add a prompt-ledger row to the last write if it is a pending one of ``table``'s, else to a new
        write: in order with the other writes, so a restart's cut deletes the drops recorded before it."""
        last = self._writes[-1] if self._writes else None
        if not isinstance(last, PromptRows) or last.table != table or len(last.rows) >= PROMPT_ROWS_PER_WRITE:
            method = "record_handouts" if table == "handouts" else "record_outcomes"
            last = PromptRows(table, lambda rows: getattr(self.store, method)(self.run_id, rows))
            self._writes.append(last)
        last.rows.append(row)

    def _actor_record(self, record: dict[str, Any]) -> None:
        """Each actor under its own names, then all actors together under the plain names, as of each
        one's latest record (the registry's ``ACTOR_AGGREGATES``)."""
        actor_id = int(record.get(registry.ACTOR_ID, 0))
        version, at = int(record[registry.POLICY_VERSION]), float(record[registry.TIME])
        self.seen.actors[actor_id] = record
        for key, value in {**actor_metrics(record), **all_actors_metrics(self.seen.actors)}.items():
            self._points.append(MetricPoint(key, value, version, at))
        if registry.UPDATE_PAUSE_MS in record and actor_id == 0:
            self._policy_version(version, pause_ms=float(record[registry.UPDATE_PAUSE_MS]))

    def _trainer_record(self, record: dict[str, Any]) -> None:
        record = registry.canonical_record(record, "trainer")  # a run written before the renames too
        version = int(record[registry.POLICY_VERSION])
        self.seen.trainer_records.append(record)
        created_at = datetime.fromtimestamp(float(record[registry.TIME]), UTC)
        entries = [
            (rollout_id, produced_by, version) for rollout_id, produced_by in record[registry.ROLLOUTS]
        ]
        trained = trained_rows(version, record.get(registry.TRAINED_GROUPS, []))  # none before the field

        def ledger_and_step() -> None:
            # First, and idempotent: a version the database holds has its trained groups (catch_up writes
            # only the versions it lacks), and a failure here leaves the rollout ledger untouched.
            self.store.record_outcomes(self.run_id, trained)
            # One ledger transaction: retried whole after an outage, so no id is counted twice.
            duplicates = self.store.record_consumed(self.run_id, entries)
            self.seen.duplicates += len(duplicates)
            self._points.append(
                MetricPoint(
                    registry.LEDGER_DUPLICATES,
                    float(self.seen.duplicates),
                    version,
                    float(record[registry.TIME]),
                )
            )
            self.store.record_step(
                self.run_id, version, record, record[registry.LAG_HISTOGRAM], created_at=created_at
            )

        self._writes.append(ledger_and_step)
        self.seen.versions[version] = {
            "samples_trained": int(record[registry.SAMPLES_TRAINED]),
            "tokens_trained": int(record[registry.TOKENS_TRAINED]),
            "created_at": created_at,
        }
        self._policy_version(version, broadcast_ms=record.get(registry.WEIGHTS_BROADCAST_MS))
        self._points.extend(
            MetricPoint(key, value, version, float(record[registry.TIME]))
            for key, value in trainer_metrics(record).items()
        )
        if registry.CHECKPOINT in record:
            checkpoint = CheckpointRecord(
                version, int(record[registry.SAMPLES_TRAINED]), record[registry.CHECKPOINT]
            )
            self._process("checkpoint", checkpoint)

    def _restart(self, restarts: int, discarded: Discarded) -> None:
        """Cut the run's records back to the checkpoint resumed from: the database forgets the
        discarded versions (their statistics, policy versions, ledger entries and prompt outcomes; the
        hand-outs stay); MLflow, whose metric history cannot be rewritten, gets the redone versions
        again at the same steps (the later point of a step is the surviving one), the restart's counts
        and a tag saying what was discarded."""
        version = discarded.resumed_from_version
        self.seen.trainer_records = [
            r for r in self.seen.trainer_records if r[registry.POLICY_VERSION] <= version
        ]
        for newer in [v for v in self.seen.versions if v > version]:
            del self.seen.versions[newer]
        for newer in [v for v in self.seen.pending if v > version]:
            del self.seen.pending[newer]
        # Not yet written: the discarded versions' points need not reach MLflow at all (evaluations stay).
        self._points = [p for p in self._points if p.step <= version or _is_evaluation(p.key)]
        now = time.time()
        self._points.extend(
            MetricPoint(key, float(value), version, now)
            for key, value in (
                (registry.RUN_RESTARTS, restarts),
                (registry.RESTART_DISCARDED_VERSIONS, len(discarded.discarded_versions)),
                (registry.RESTART_DISCARDED_ROLLOUTS, discarded.discarded_rollouts),
                (registry.RESTART_LOST_IN_FLIGHT, discarded.lost_in_flight),
                (registry.RESTART_KEPT_IN_ACTORS, discarded.kept_in_actors),
                (registry.RESTART_REGENERATED, discarded.regenerated),
            )
        )
        mlflow, mlflow_run_id, store, run_id = self.mlflow, self.mlflow_run_id, self.store, self.run_id

        def cut() -> None:
            store.discard_after(run_id, version)
            if mlflow is not None and mlflow_run_id is not None:
                mlflow.set_tag(mlflow_run_id, f"pipelinerl.restart.{restarts}", discarded.describe()[:5000])

        self._writes.append(cut)

    def _policy_version(self, version: int, **fields: Any) -> None:
        """Record fields of a policy version once the trainer's record of it has been seen."""
        pending = self.seen.pending.setdefault(version, {})
        pending.update({key: value for key, value in fields.items() if value is not None})
        if version in self.seen.versions:
            values = {**self.seen.versions[version], **self.seen.pending.pop(version)}
            self._writes.append(lambda: self.store.record_policy_version(self.run_id, version, **values))

    def _log_figures(self) -> None:
        from pipelinerl.platform.tracking import figures  # noqa: PLC0415 (matplotlib: the dashboard and `runs list` import this via catch_up)

        records = self.seen.trainer_records
        if not records or self.mlflow is None or self.mlflow_run_id is None:
            return
        for name, figure in (
            ("lag_histogram", figures.lag_histogram(records)),
            ("lag_by_position", figures.lag_by_position(records)),
            ("learning_curves", figures.learning_curves(records, self.seen.evals)),
            ("ess_by_step", figures.ess_by_step(records)),
        ):
            self.mlflow.log_figure(self.mlflow_run_id, figure, f"figures/{name}.png")


def _is_evaluation(key: str) -> bool:
    """An evaluation's metric (in-run ``eval/<set>/...`` or the held-out ``eval/success``)."""
    metric = registry.declaration(key)
    return metric is not None and (metric.owner == "eval" or metric.name == registry.EVAL_SUCCESS)
