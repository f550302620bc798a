"""Role heartbeats: how ``rl-run`` knows that a node's host is still there.

A role flow run (``rl-role``) on a pool's worker writes ``<run_dir>/roles/<role><node>.json`` every
``HEARTBEAT_INTERVAL_S`` (its host name, pid and the time) while its stages run. The shared run
directory carries it to the launcher, which needs nothing else from that host. Prefect alone cannot
tell: when a host disappears (powered off, its cable cut, every process on it killed), its worker
dies with it and nobody ever moves that flow run out of RUNNING. The launcher (``flows/placement.py``)
takes a heartbeat older than ``cluster.heartbeat_timeout_s`` as the host lost, names it, marks the
flow run crashed, and fails or restarts the run.

A lost host is often not the first thing the launcher sees: the trainer's broadcast to an actor whose
processes were killed fails at once (their sockets reset), long before that actor's heartbeat lapses.
So when a role fails, the launcher first looks at the other roles' heartbeats (``attribution``): one
that is late (older than ``LATE_S``, a missed beat and some) is watched until it beats again or lapses;
a lapse means that host was lost, and the run fails (or restarts) naming it, with the role that failed
because of it.

The times are wall-clock times written on one node and read on another: the nodes' clocks must agree
to well within the timeout (NTP does; a skew of seconds against a 60 s timeout is harmless).

When a role's stages end (done, failed or stopped) its last heartbeat says so (``ended``): from then
on its silence is not a lost host, however long its flow run takes to report its end (seconds on a
loaded machine, while a failed attempt is torn down). A host that is lost writes no such beat.
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

from pipelinerl.platform.atomic_file import write_atomically

HEARTBEAT_INTERVAL_S = 5.0
LATE_S = 2 * HEARTBEAT_INTERVAL_S + 2.0  # a heartbeat this old has missed a beat: its host may be gone


@dataclass(frozen=True)
class Heartbeat:
    host: str
    pid: int
    time: float
    ended: bool = False  # the role's stages ended here: its silence from now on is not a lost host

    def age_s(self, now: float) -> float:
        return max(0.0, now - self.time)


def heartbeat_path(run_dir: Path, role: str, node: int) -> Path:
    return run_dir / "roles" / f"{role}{node}.json"


def write_heartbeat(path: Path, host: str, ended: bool = False) -> None:
    beat = {"host": host, "pid": os.getpid(), "time": time.time(), "ended": ended}
    write_atomically(path, json.dumps(beat), make_parents=True)


def read_heartbeat(path: Path) -> Heartbeat | None:
    """The newest heartbeat at ``path``, or None if none was written (or it cannot be read)."""
    try:
        data = json.loads(path.read_text())
        return Heartbeat(
            str(data["host"]), int(data["pid"]), float(data["time"]), bool(data.get("ended", False))
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


@contextlib.contextmanager
def beating(path: Path, interval_s: float = HEARTBEAT_INTERVAL_S) -> Iterator[str]:
    """Write this host's heartbeat to ``path`` now and every ``interval_s`` until the block ends, and
    then a last one that says it ended (however it ends); yields the host name."""
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
        with contextlib.suppress(OSError):
            write_heartbeat(path, host, ended=True)


def attribution(ages: dict[str, float | None], timeout_s: float) -> tuple[str | None, list[str]]:
    """Given the heartbeat ages of the roles still running (role name -> seconds; None: no heartbeat
    yet, or its stages ended) when another role failed: the role whose heartbeat lapsed first (the
    oldest older than ``timeout_s``: its host is lost, and the others may have stopped because of it),
    and the roles whose heartbeat is late but not lapsed (to watch until they beat again or lapse)."""
    lapsed = {name: age for name, age in ages.items() if age is not None and age > timeout_s}
    late = [name for name, age in ages.items() if age is not None and LATE_S < age <= timeout_s]
    return (max(lapsed, key=lambda name: lapsed[name]) if lapsed else None), late
