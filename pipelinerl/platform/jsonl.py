"""Per-stage metric records as JSON lines: stages append, the run's tracking owner tails.

A stage never talks to MLflow or the database itself: it appends one line per record to its own
file under the run directory (cheap, never blocks on a server, survives a crash up to the last
complete line), and the launcher process reads the new lines and writes them in batches.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one record to ``path`` (created with its folder on the first): for rare records, where
    a file held open by every run for none would only clutter the run directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(record) + "\n")


class JsonlWriter:
    """Append records to one file, one JSON object per line, flushed line by line (thread-safe)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a")
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


class JsonlTail:
    """The complete lines appended to a file since the last call (a partial last line waits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        return [json.loads(line) for line in data[:end].decode().splitlines() if line.strip()]


def step_records(run_dir: Path) -> dict[int, dict[str, Any]]:
    """A run's trainer step records (``metrics.jsonl``: the surviving lineage) by policy version; a
    line cut by a crash is no step."""
    path = run_dir / "metrics.jsonl"
    records: dict[int, dict[str, Any]] = {}
    if not path.is_file():
        return records
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            records[int(record["policy_version"])] = record
        except (ValueError, KeyError, TypeError):
            continue
    return records
