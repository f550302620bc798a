"""Role heartbeats: how ``rl-run`` knows that a node's host is still there.

A role flow run (``rl-role``) on a pool's worker writes ``<run_dir>/roles/<role><node>.json`` every
``HEARTBEAT_INTERVAL_S`` (its host name, pid and the time) while its stages run. The shared run
directory carries it to the launcher, which needs nothing else from that host. Prefect alone cannot
tell: when a host disappears (powered off, its cable cut, every process on it killed), its worker
dies with it and nobody ever moves that flow run out of RUNNING. The launcher (``flows/placement.py``)
takes a heartbeat older than ``cluster.heartbeat_timeout_s`` as the host lost, names it, marks the
flow run crashed, and fails or restarts the run.

The times are wall-clock times written on one node and read on another: the nodes' clocks must agree
to well within the timeout (NTP does; a skew of seconds against a 60 s timeout is harmless).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HEARTBEAT_INTERVAL_S = 5.0


@dataclass(frozen=True)
class Heartbeat:
    host: str
    pid: int
    time: float

    def age_s(self, now: float) -> float:
        return max(0.0, now - self.time)


def heartbeat_path(run_dir: Path, role: str, node: int) -> Path:
    return run_dir / "roles" / f"{role}{node}.json"


def write_heartbeat(path: Path, host: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"host": host, "pid": os.getpid(), "time": time.time()}))
    tmp.replace(path)  # atomic: a reader never sees half a file


def read_heartbeat(path: Path) -> Heartbeat | None:
    """The newest heartbeat at ``path``, or None if none was written (or it cannot be read)."""
    try:
        data = json.loads(path.read_text())
        return Heartbeat(str(data["host"]), int(data["pid"]), float(data["time"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


@contextlib.contextmanager
def beating(path: Path, interval_s: float = HEARTBEAT_INTERVAL_S) -> Iterator[str]:
    """Write this host's heartbeat to ``path`` now and every ``interval_s`` until the block ends;
    yields the host name."""
    host = socket.gethostname()
    write_heartbeat(path, host)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval_s):
            with contextlib.suppress(OSError):  # shared storage may hiccup; the next beat retries
                write_heartbeat(path, host)

    thread = threading.Thread(target=beat, name="role-heartbeat", daemon=True)
    thread.start()
    try:
        yield host
    finally:
        stop.set()
        thread.join()
