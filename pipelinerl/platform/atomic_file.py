"""Writing a file so that a reader never sees half of it: a temporary beside it, then a rename.

The run directory is read while it is written (the launcher tails records, the dashboard reads the
phase, a role reads its stop request, a replay reads a step's batch), often by another process or
another node on shared storage; a rename within one directory is atomic there.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: Path, data: str | bytes, *, make_parents: bool = False) -> None:
    """Write ``data`` to ``path`` through a temporary of this process beside it, then rename it."""
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(data)
    tmp.replace(path)
