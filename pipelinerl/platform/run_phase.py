"""What a run is doing, in words, in its run directory (``phase.json``): the launcher writes each phase
as it enters it ("measuring held-out success of the starting policy", "started trainer0, ..."), so the
dashboard can say what a run does before its first step, when there is nothing yet to draw."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from pipelinerl.platform.atomic_file import write_atomically

PHASE_FILE = "phase.json"


@dataclass(frozen=True)
class Phase:
    text: str
    since: float  # Unix time it began


def write_phase(run_dir: Path, text: str) -> None:
    """Record that the run is now at ``text`` (atomically; a run directory that is gone is no error)."""
    with contextlib.suppress(OSError):
        write_atomically(run_dir / PHASE_FILE, json.dumps({"text": text, "since": time.time()}))


def read_phase(run_dir: Path) -> Phase | None:
    """The run's latest phase, or None if it wrote none (or the file cannot be read)."""
    try:
        data = json.loads((run_dir / PHASE_FILE).read_text())
        return Phase(str(data["text"]), float(data["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
