"""Catching the stores up with a run whose launcher died: what its run directory holds and they lack.

A launcher hands the stages' records to its tracker, which writes them every few seconds; killed, it
leaves the platform database and MLflow behind the run directory (measured: two versions and half of
their ledger rows). Whoever marks such a run crashed (``pipelinerl runs list``, the dashboard) calls
``catch_up``: it reads the run directory's record files (``metrics.jsonl``, ``actor<k>.jsonl``,
``preprocessor.jsonl``, ``eval.jsonl``) and writes, through the same ``RunTracker`` code a live run
uses, every trainer record of a version the database lacks (its step statistics, lag histogram,
policy version, ledger rows and the groups it trained) and the other stages' records after the newest
version it held, and every prompt record (``prompts/``: the hand-outs and the drops; the prompt ledger
keeps one row of each however often it is written, and a restart has already set the discarded
versions' drops aside). Every write is idempotent (upserts; the ledgers insert each row once), so two
listers catching the same run up at once write it once. A run written before the metric renames is
caught up under the new names (the tracker reads each trainer record through
``metric_registry.canonical_record``).

MLflow is written when its URI is given and its run reachable; the database is written either way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.jsonl import JsonlTail
from pipelinerl.platform.prompt_records import all_drops, handed_out_path
from pipelinerl.platform.tracking.db import utcnow
from pipelinerl.platform.tracking.liveness import HEARTBEAT_STALE_S, liveness_here
from pipelinerl.platform.tracking.metric_registry import ACTOR_ID, POLICY_VERSION, STEP
from pipelinerl.platform.tracking.mlflow_store import MLFLOW_STATUS, MlflowStore, artifact_root
from pipelinerl.platform.tracking.run_tracker import RunTracker
from pipelinerl.platform.tracking.store import PlatformStore, RunRow

logger = logging.getLogger("pipelinerl.tracking")


@dataclass(frozen=True)
class CaughtUp:
    """What ``catch_up`` wrote for one run (``versions``: the trainer versions new to the database)."""

    run_id: str
    versions: tuple[int, ...] = ()
    ledger_rows: int = 0
    mlflow: bool = False  # the MLflow run got the same records
    note: str = ""  # why something was not written

    def describe(self) -> str:
        if not self.versions and not self.ledger_rows:
            return f"{self.run_id}: nothing to catch up{f' ({self.note})' if self.note else ''}"
        span = f"v{self.versions[0]}..v{self.versions[-1]}" if self.versions else "no version"
        where = "database and MLflow" if self.mlflow else "database"
        note = f"; {self.note}" if self.note else ""
        return (
            f"{self.run_id}: wrote {len(self.versions)} version(s) ({span}) and {self.ledger_rows} ledger "
            f"row(s) from its run directory to the {where}{note}"
        )


def _records(path: Path) -> list[dict[str, Any]]:
    return JsonlTail(path).read() if path.exists() else []


def missing_records(run_dir: Path, num_actors: int, recorded: set[int]) -> list[tuple[str, dict[str, Any]]]:
    """The run directory's records the database lacks, as ``(kind, record)`` in the order a live run
    hands them over: the trainer's versions not in ``recorded``; of the other stages, the records after
    the newest recorded version (they carry no row of their own there, only MLflow points); every
    prompt record (the prompt ledger takes each once)."""
    newest = max(recorded, default=-1)
    records: list[tuple[str, dict[str, Any]]] = []
    for actor_id in range(num_actors):
        records += [
            ("actor", r)
            for r in _records(run_dir / f"actor{actor_id}.jsonl")
            if int(r[POLICY_VERSION]) > newest
        ]
    records += [
        ("preprocessor", r) for r in _records(run_dir / "preprocessor.jsonl") if int(r[STEP]) > newest
    ]
    records += [
        ("eval_round", r) for r in _records(run_dir / "eval.jsonl") if int(r[POLICY_VERSION]) > newest
    ]
    for actor_id in range(num_actors):
        handouts = _records(handed_out_path(run_dir, actor_id))
        records += [("handout", {**r, ACTOR_ID: actor_id}) for r in handouts]
    records += [("dropped", r) for r in all_drops(run_dir)]
    records += [
        ("trainer", r) for r in _records(run_dir / "metrics.jsonl") if int(r[POLICY_VERSION]) not in recorded
    ]
    return records


def catch_up(store: PlatformStore, run: RunRow, mlflow_uri: str | None = None) -> CaughtUp:
    """Write what ``run``'s directory holds and the stores lack (see the module docstring); a crashed
    run's MLflow run still shown running is then ended as failed."""
    config = PipelineConfig.model_validate(store.get_run(run.id).config)
    mlflow, notes = None, []
    if mlflow_uri is not None and run.mlflow_run_id is not None:
        try:
            mlflow = MlflowStore(mlflow_uri, artifact_root(config))
        except Exception as error:  # an unreachable MLflow must not keep the database behind too
            notes.append(f"MLflow not written: {str(error)[:200]}")
    written: list[int] = []
    ledger_rows = 0
    if run.run_dir is None:
        notes.append("the database holds no run directory for it (recorded before revision 0003)")
    elif not Path(run.run_dir).is_dir():
        notes.append(f"its run directory {run.run_dir} is not reachable from here")
    else:
        records = missing_records(Path(run.run_dir), config.actor.num_actors, store.recorded_versions(run.id))
        ledger_before = len(store.consumed_ids(run.id))
        if not RunTracker.attach(config, run.id, store, mlflow, run.mlflow_run_id).write(records):
            notes.append("a store refused some records (see the log)")
        written = sorted(int(record[POLICY_VERSION]) for kind, record in records if kind == "trainer")
        ledger_rows = len(store.consumed_ids(run.id)) - ledger_before
    if mlflow is not None and run.mlflow_run_id is not None and run.status == "crashed":
        try:  # after the records: MLflow takes points for an ended run as for a running one
            if mlflow.client.get_run(run.mlflow_run_id).info.status == "RUNNING":
                mlflow.end_run(run.mlflow_run_id, MLFLOW_STATUS["crashed"])
        except Exception as error:  # MLflow's errors are of many types
            notes.append(f"MLflow run not ended: {str(error)[:200]}")
    caught = CaughtUp(
        run.id, tuple(written), ledger_rows, mlflow=mlflow is not None and not notes, note="; ".join(notes)
    )
    logger.info("tracking: caught up %s", caught.describe())
    return caught


def mark_crashed_and_catch_up(
    store: PlatformStore, mlflow_uri: str | None, stale_after_s: float = HEARTBEAT_STALE_S
) -> list[tuple[RunRow, CaughtUp]]:
    """Mark crashed every running run whose launcher is gone (``liveness``: its process, on this host;
    else a heartbeat older than ``stale_after_s``), and catch each one's stores up."""
    crashed = store.mark_silent_runs_crashed(utcnow(), stale_after_s, liveness=liveness_here)
    return [(run, catch_up(store, run, mlflow_uri)) for run in crashed]
