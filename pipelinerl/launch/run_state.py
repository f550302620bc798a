"""What a run directory says of the launcher that runs it and of its starting policy's evaluation:
what ``pipelinerl resume`` reads to resume a run in place after its launcher died.

* ``launcher.json``: the launcher process's identity (``liveness.this_process``), written when it
  starts the run or resumes it; ``liveness.liveness_here`` tells whether it is still alive.
* ``held_out_start.json``: held-out success of the starting policy, measured once per run (a resumed
  run does not measure it again).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelinerl.platform.atomic_file import write_atomically
from pipelinerl.platform.tracking.liveness import this_process

LAUNCHER_FILE = "launcher.json"
HELD_OUT_START_FILE = "held_out_start.json"


def write_launcher(run_dir: Path) -> None:
    write_atomically(run_dir / LAUNCHER_FILE, json.dumps(this_process()))


def read_launcher(run_dir: Path) -> dict[str, Any] | None:
    """The identity of the run's latest launcher; None for a run from before it was written."""
    path = run_dir / LAUNCHER_FILE
    if not path.is_file():
        return None
    identity = json.loads(path.read_text())
    return identity if isinstance(identity, dict) else None


def write_held_out_start(run_dir: Path, success: float) -> None:
    write_atomically(run_dir / HELD_OUT_START_FILE, json.dumps({"success": success}))


def read_held_out_start(run_dir: Path) -> float | None:
    path = run_dir / HELD_OUT_START_FILE
    if not path.is_file():
        return None
    return float(json.loads(path.read_text())["success"])
