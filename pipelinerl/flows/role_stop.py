"""Stop requests: how ``rl-run`` tells a role flow run to stop its stages, through the run directory.

Prefect's own cancellation of a *running* flow run is carried out inside the flow run's process,
which learns of it from the API's event stream (a worker only cancels flow runs that never started).
When that stream is away (the Prefect server restarted mid-run, a loaded API), a cancelled role kept
its stages running: a failed attempt's actor flow run stayed ``Cancelling`` for the launcher's whole
wait, the restart waited 90 s for it, and the run ended with it still not final.

So the launcher (``flows/placement.py``) also writes ``<run_dir>/roles/stop/<flow run id>`` with its
reason, the same shared directory that carries the roles' heartbeats (``flows/role_heartbeat.py``);
the role flow run (``flows/rl_role.py``) looks for its own file every turn of its loop, stops its
stages and ends ``Cancelled`` with that reason. A request outlives restarts (it is named by the flow
run, never by the role), so a role flow run that a worker picks up only after its attempt was stopped
stops at once instead of joining the next attempt.
"""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

from pipelinerl.platform.atomic_file import write_atomically


def stop_request_path(run_dir: Path, flow_run_id: UUID | str) -> Path:
    return run_dir / "roles" / "stop" / str(flow_run_id)


def request_stop(path: Path, reason: str) -> None:
    """Ask the role flow run behind ``path`` to stop, saying why (written atomically)."""
    write_atomically(path, reason, make_parents=True)


def stop_requested(path: Path) -> str | None:
    """The reason the launcher asked this role flow run to stop, or None if it has not."""
    try:
        return path.read_text() or "the run asked this role to stop"
    except OSError:
        return None
