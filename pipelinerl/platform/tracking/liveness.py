"""Whether a run's launcher is still alive, from the identity it recorded when the run started.

A launcher records who it is (``this_process``): its host name, the kernel's boot id, its pid and its
start time in clock ticks since boot (``/proc/<pid>/stat``, field 22). Whoever lists the runs can
then judge a run still marked running (``judge``):

* on the same host and boot: **alive** when a process with that pid and that start time exists,
  **gone** otherwise (a recycled pid has another start time). A local crash is therefore seen at the
  next listing, whatever the heartbeat says; a launcher that is alive but slow to beat is not
  declared crashed.
* elsewhere (another node, another boot, a run recorded before identities existed): **unknown**;
  the heartbeat decides (``store.HEARTBEAT_STALE_S``).

``judge`` is pure; ``this_process`` and ``start_ticks`` read ``/proc`` (Linux). Containers on one
kernel share its boot id but not their pid namespaces; they have their own host names, which keeps
them apart.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

# A running run's launcher writes its heartbeat every HEARTBEAT_S from a thread of its own (never held up
# by a slow store write). Whoever lists the runs marks one crashed when its launcher is proven gone (on
# the same host: tracking/liveness.py) or, where that cannot be seen, when its heartbeat is older than
# HEARTBEAT_STALE_S: one interval, plus HEARTBEAT_GRACE_S for a beat delayed by a loaded machine or a
# slow database and for the clocks of two hosts disagreeing.
HEARTBEAT_S = 10.0
HEARTBEAT_GRACE_S = 20.0
HEARTBEAT_STALE_S = HEARTBEAT_S + HEARTBEAT_GRACE_S
Liveness = Literal["alive", "gone", "unknown"]
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
# /proc/<pid>/stat field 22 (1-based): the process's start time in clock ticks after boot.
START_TIME_FIELD = 22


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: count fields after its end.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[START_TIME_FIELD - 3])
    except (IndexError, ValueError):
        return None


def boot_id() -> str | None:
    try:
        return BOOT_ID_FILE.read_text().strip()
    except OSError:
        return None


def this_process() -> dict[str, Any]:
    """The identity of the calling process, as a run records its launcher."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "boot_id": boot_id(), "pid": pid, "start_ticks": start_ticks(pid)}


def judge(
    identity: Mapping[str, Any] | None,
    *,
    host: str,
    boot: str | None,
    started: Callable[[int], int | None],
) -> Liveness:
    """Whether the process of ``identity`` lives, seen from ``host`` booted as ``boot``, where
    ``started(pid)`` tells when a local process started (None: no such process)."""
    if not identity or boot is None:
        return "unknown"
    pid, ticks = identity.get("pid"), identity.get("start_ticks")
    if identity.get("host") != host or identity.get("boot_id") != boot:
        return "unknown"
    if not isinstance(pid, int) or not isinstance(ticks, int):
        return "unknown"
    return "alive" if started(pid) == ticks else "gone"


def liveness_here(identity: Mapping[str, Any] | None) -> Liveness:
    """``judge`` from this process's host and boot."""
    return judge(identity, host=socket.gethostname(), boot=boot_id(), started=start_ticks)
