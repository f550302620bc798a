"""What the dashboard reads from a run's directory: the per-step records the database does not keep.

The platform database stores each step's lag summary and histogram, but not the trainer's lag by
token position (``lag/by_position``, the paper's heat map) nor the count of sequences written by
two or more policy versions (``trainer/inflight_sequences``); MLflow does not have them either. They
are in the trainer's ``metrics.jsonl``. Likewise the preprocessor's ``preprocessor.jsonl`` is the
only place that says how many batches wait ahead of the trainer. Those files are read here,
read-only, and incrementally: a poll reads only the bytes appended since the last one. A trainer
record written before the metric renames is read under the current names
(``metric_registry.canonical_record``). A planned run's ``plan_prediction.json`` (the simulator's
prediction beside what the run measured, written at its end) is read whole (``read_prediction``).
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelinerl.plan.measured import COMPARED, PREDICTION_FILE
from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.tracking.metric_registry import Record, canonical_record

# Keys of a trainer record kept in memory (a record also holds the rollout ids of its step).
TRAINER_KEYS = (
    registry.POLICY_VERSION,
    registry.LAG_BY_POSITION,
    registry.LAG_POSITION_BUCKET_SIZE,
    registry.TRAINER_INFLIGHT_SEQUENCES,
    registry.TIME,
)
PREPROCESSOR_KEYS = (
    registry.STEP,
    registry.TRAINER_VERSION,
    registry.QUEUE_ROLLOUTS,
    registry.PREPROCESSOR_HELD_S,
    registry.TIME,
)


def run_directory(config: dict[str, Any], run_id: str, checkpoint_paths: list[str]) -> Path | None:
    """Where the run wrote its files: ``run.output_dir/<id>`` from its stored configuration (a
    relative ``output_dir`` is taken from the dashboard's working directory, as the launcher took it
    from its own), else the run directory that holds one of its checkpoints; None if neither exists.
    A run directory is known by its ``config.json`` (the launcher writes it first) or its trainer's
    ``metrics.jsonl``: before the first step there are no records yet, and that is no missing directory."""
    output_dir = (config.get("run") or {}).get("output_dir")
    candidates = [Path(str(output_dir)).expanduser() / run_id] if output_dir else []
    candidates += [Path(path).parent.parent for path in checkpoint_paths if path]
    for candidate in candidates:
        if (candidate / "metrics.jsonl").is_file() or (candidate / "config.json").is_file():
            return candidate.resolve()
    return None


@dataclass
class _Tail:
    """The records of one JSON-lines file read so far, and where reading stopped."""

    offset: int = 0
    size_seen: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)


class RunFiles:
    """Incremental, thread-safe readers of the JSON-lines files of run directories."""

    def __init__(self, max_files: int = 64) -> None:
        self._tails: dict[Path, _Tail] = {}
        self._lock = threading.Lock()
        self._max_files = max_files

    def trainer_records(self, run_dir: Path) -> list[dict[str, Any]]:
        """The trainer's records (only ``TRAINER_KEYS``), one per policy version, the first kept
        where a restart wrote a version again (as the launcher does)."""
        records = self._read(run_dir / "metrics.jsonl", TRAINER_KEYS, "trainer")
        seen: set[int] = set()
        unique = []
        for record in records:
            version = record.get(registry.POLICY_VERSION)
            if isinstance(version, int) and version not in seen:
                seen.add(version)
                unique.append(record)
        return unique

    def preprocessor_records(self, run_dir: Path) -> list[dict[str, Any]]:
        return self._read(run_dir / "preprocessor.jsonl", PREPROCESSOR_KEYS, "preprocessor")

    def _read(self, path: Path, keys: tuple[str, ...], kind: Record) -> list[dict[str, Any]]:
        with self._lock:
            tail = self._tails.get(path)
            if tail is None:
                if len(self._tails) >= self._max_files:  # forget the oldest file read
                    self._tails.pop(next(iter(self._tails)))
                tail = self._tails[path] = _Tail()
            try:
                size = path.stat().st_size
            except OSError:
                return []
            if size < tail.size_seen:  # the file was replaced: read it again
                tail.offset, tail.records = 0, []
            tail.size_seen = size
            if size > tail.offset:
                with path.open("rb") as file:
                    file.seek(tail.offset)
                    chunk = file.read(size - tail.offset)
                complete = chunk.rfind(b"\n") + 1  # a line still being written waits for the next poll
                for line in chunk[:complete].splitlines():
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(record, dict):
                        record = canonical_record(record, kind)
                        tail.records.append({key: record[key] for key in keys if key in record})
                tail.offset += complete
            return list(tail.records)


# The run page's "predicted vs measured" rows: (label, the measured figure; the predicted one it is
# compared with is plan.measured.COMPARED's).
PREDICTION_ROWS = (
    ("samples/s after the first step", "steady_samples_per_s"),
    ("actor idle", "actor_idle"),
    ("trainer idle after the first step", "trainer_idle"),
    ("lag mean", "lag_mean"),
    ("lag max", "lag_max"),
)


def _figure(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def read_prediction(run_dir: Path) -> dict[str, Any] | None:
    """The simulator's prediction of the run beside what it measured (``plan_prediction.json``, written
    at a planned run's end: ``plan/measured.py``), as the run page's rows; ``{"error": ...}`` when the
    run wrote why it could not compare; None when there is no such file or it is damaged (the page
    then leaves the table out)."""
    try:
        data = json.loads((run_dir / PREDICTION_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("error"), str):
        return {"error": data["error"], "rows": []}
    predicted, seen = data.get("predicted"), data.get("measured")
    if not isinstance(predicted, dict) or not isinstance(seen, dict):
        return None
    rows = []
    for label, name in PREDICTION_ROWS:
        before, after = _figure(predicted.get(COMPARED.get(name, name))), _figure(seen.get(name))
        if before is None or after is None:
            continue
        rows.append(
            {
                "figure": name,
                "label": label,
                "predicted": before,
                "measured": after,
                "difference": before - after,
                "relative": (before - after) / after if after else None,
            }
        )
    if not rows:
        return None
    asked = {key: data.get(key) for key in ("profile", "lengths", "mode")}
    return {**{key: value if isinstance(value, str) else None for key, value in asked.items()}, "rows": rows}
