"""The local platform stack: a Prefect server, an MLflow server and process workers, in the background.

``up(home)`` starts, on 127.0.0.1 and each in its own process group with its log under
``<home>/stack/logs/``:

* a Prefect server (``prefect server start``; its database in ``<home>/prefect``);
* an MLflow server on the platform's store (``sqlite:///<home>/mlflow.db``, artifacts in
  ``<home>/mlartifacts``), after ``mlflow db upgrade`` has created or migrated that store once
  (two processes first touching a fresh store race on its schema; ENVIRONMENT.md);
* one process worker per work pool: ``actors``, ``trainers`` and the launch pool (``local``),
  with ``MLFLOW_TRACKING_URI`` set to the MLflow server, so flow runs track there;

waits until each answers (``/api/health``, ``/health``, the worker's heartbeat), registers the
deployments (``flows/deploy.py``) and writes ``<home>/stack/state.json``. ``down(home)`` stops
exactly the processes that file lists (workers with SIGINT, servers with SIGTERM to their group,
SIGKILL for what is left) and removes it.

This module does the process I/O; what it starts and the state file it writes are decided, purely,
in ``flows/stack_plan.py`` (``StackState``, the ``*_command`` lines, ``stack_env``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import psutil

from pipelinerl.flows.deploy import LAUNCH_POOL, REPO_ROOT
from pipelinerl.flows.stack_plan import (
    DEFAULT_MLFLOW_PORT,
    DEFAULT_PREFECT_PORT,
    DEFAULT_UI_PORT,
    DEPLOY_TIMEOUT_S,
    HOST,
    STARTUP_TIMEOUT_S,
    STOP_GRACE_S,
    Role,
    StackError,
    StackProcess,
    StackState,
    dashboard_command,
    default_store_uri,
    deploy_command,
    log_tail,
    logs_dir,
    mlflow_server_command,
    mlflow_upgrade_command,
    new_state,
    prefect_server_command,
    stack_env,
    state_path,
    stop_order,
    worker_command,
    worker_name,
)
from pipelinerl.platform.atomic_file import write_atomically

# ----- process I/O -----

# Popen objects of the processes this interpreter started: kept so that ``down`` in the same
# interpreter (tests) reaps them instead of leaving zombies, and so that no "still running"
# ResourceWarning fires when ``up`` returns.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def read_state(home: Path) -> StackState | None:
    path = state_path(home)
    if not path.exists():
        return None
    try:
        return StackState.model_validate_json(path.read_text())
    except ValueError as error:
        raise StackError(
            f"{path} is not a stack state file ({error.__class__.__name__}); remove it"
        ) from None


def write_state(state: StackState) -> None:
    path = state_path(state.home)
    write_atomically(path, state.model_dump_json(indent=2), make_parents=True)


def is_alive(proc: StackProcess) -> bool:
    """The recorded process still runs (same pid and start time; a zombie counts as gone)."""
    reap(proc.pid)
    try:
        process = psutil.Process(proc.pid)
        return (
            abs(process.create_time() - proc.create_time) < 0.5 and process.status() != psutil.STATUS_ZOMBIE
        )
    except psutil.Error:
        return False


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``."""
    members = []
    for process in psutil.process_iter(["pid", "status"]):
        try:
            if process.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(process.pid) == pgid:
                members.append(process.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def reap(pid: int) -> None:
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        _CHILDREN.pop(pid, None)


def check_port_free(port: int, what: str, option: str) -> None:
    """Fail at once, naming the port, if something listens on ``127.0.0.1:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError as error:
            raise StackError(
                f"port {port} on {HOST} ({what}) is in use ({error.strerror}); choose another with {option}"
            ) from None


def _http_ok(url: str, timeout_s: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return 200 <= response.status < 300
    except (OSError, urllib.error.URLError):
        return False


def prefect_healthy(api_url: str) -> bool:
    return _http_ok(f"{api_url}/health")


def mlflow_healthy(url: str) -> bool:
    return _http_ok(f"{url}/health")


def worker_online(api_url: str, pool: str, name: str) -> bool:
    """The worker ``name`` has sent its heartbeat to ``pool`` (status ONLINE)."""
    request = urllib.request.Request(
        f"{api_url}/work_pools/{pool}/workers/filter",
        data=b"{}",
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            workers = json.loads(response.read())
    except (OSError, urllib.error.URLError, ValueError):
        return False
    return any(w.get("name") == name and w.get("status") == "ONLINE" for w in workers)


def start_process(
    name: str, role: Role, command: list[str], env: Mapping[str, str], log: Path, stop_signal: str
) -> StackProcess:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as handle:
        handle.write(f"\n=== {datetime.now(UTC).isoformat()} {' '.join(command)}\n".encode())
        handle.flush()
        process = subprocess.Popen(
            command,
            env=dict(env),
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own session and process group: `down` signals the group
        )
    _CHILDREN[process.pid] = process
    try:
        create_time = psutil.Process(process.pid).create_time()
    except psutil.Error:
        create_time = 0.0
    return StackProcess(
        name=name,
        role=role,
        pid=process.pid,
        pgid=process.pid,
        create_time=create_time,
        stop_signal=stop_signal,  # type: ignore[arg-type]
        command=command,
        log=log,
    )


def wait_until(
    checks: Mapping[str, tuple[Callable[[], bool], StackProcess]], timeout_s: float, poll_s: float = 0.5
) -> None:
    """Poll every check until all pass; fail with the log tail of a process that died or timed out."""
    pending = dict(checks)
    deadline = time.monotonic() + timeout_s
    while pending:
        for what, (check, proc) in list(pending.items()):
            if check():
                del pending[what]
                continue
            if not is_alive(proc):
                child = _CHILDREN.get(proc.pid)
                code = child.returncode if child is not None else None
                raise StackError(
                    f"{what} exited (code {code}) while starting; last lines of {proc.log}:\n"
                    f"{log_tail(proc.log)}"
                )
        if not pending:
            return
        if time.monotonic() > deadline:
            what, (_, proc) = next(iter(pending.items()))
            raise StackError(
                f"{what} did not become ready in {timeout_s:.0f} s; last lines of {proc.log}:\n"
                f"{log_tail(proc.log)}"
            )
        time.sleep(poll_s)


def running_state(home: Path) -> StackState | None:
    """The state of a stack that still has a live process in ``home``; a stale file is removed."""
    state = read_state(home)
    if state is None:
        return None
    if any(is_alive(p) or group_members(p.pgid) for p in state.processes):
        return state
    state_path(home).unlink(missing_ok=True)
    return None


def run_step(command: list[str], env: Mapping[str, str], log: Path, what: str, timeout_s: float) -> str:
    """Run a one-off command to completion, appending its output to ``log``; return its stdout."""
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            command,
            env=dict(env),
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        raise StackError(f"{what} did not finish in {timeout_s:.0f} s") from None
    with log.open("ab") as handle:
        handle.write(f"\n=== {datetime.now(UTC).isoformat()} {' '.join(command)}\n".encode())
        handle.write(done.stdout + done.stderr)
    if done.returncode != 0:
        raise StackError(f"{what} failed (code {done.returncode}); last lines of {log}:\n{log_tail(log)}")
    return done.stdout.decode(errors="replace")


def up(
    home: Path,
    prefect_port: int = DEFAULT_PREFECT_PORT,
    mlflow_port: int = DEFAULT_MLFLOW_PORT,
    *,
    launch_pool: str = LAUNCH_POOL,
    mlflow_store_uri: str | None = None,
    ui_port: int | None = DEFAULT_UI_PORT,
    timeout_s: float = STARTUP_TIMEOUT_S,
    on_status: Callable[[str], None] | None = None,
) -> StackState:
    """Start the stack in the background and return its state (see the module docstring).

    Raises ``StackError`` if a stack already runs in ``home``, if a port is taken, or if a service
    does not come up (then everything started so far is stopped again).
    """
    status = on_status or (lambda text: None)
    home = home.expanduser().resolve()
    running = running_state(home)
    if running is not None:
        raise StackError(
            f"a stack is already running in {home} (Prefect UI {running.prefect_ui_url}, MLflow UI "
            f"{running.mlflow_url}); stop it with `pipelinerl down --home {home}`"
        )
    if prefect_port == mlflow_port:
        raise StackError(f"the Prefect and MLflow servers cannot share port {prefect_port}")
    check_port_free(prefect_port, "Prefect server", "--prefect-port")
    check_port_free(mlflow_port, "MLflow server", "--mlflow-port")
    if ui_port is not None:
        if ui_port in (prefect_port, mlflow_port):
            raise StackError(f"the dashboard cannot share port {ui_port} with the Prefect or MLflow server")
        check_port_free(ui_port, "dashboard", "--ui-port")

    store_uri = mlflow_store_uri or default_store_uri(home)
    state = new_state(home, prefect_port, mlflow_port, store_uri, launch_pool)
    state.artifacts_dir.mkdir(parents=True, exist_ok=True)
    logs = logs_dir(home)
    base = dict(os.environ)

    def env(role: Role) -> dict[str, str]:
        return stack_env(base, home, prefect_port, mlflow_port, role)

    def started(proc: StackProcess) -> StackProcess:
        state.processes.append(proc)
        write_state(state)  # at once: an interrupted `up` can still be stopped with `down`
        return proc

    try:
        status("starting the Prefect server")
        prefect = started(
            start_process(
                "prefect-server",
                "prefect-server",
                prefect_server_command(prefect_port),
                env("prefect-server"),
                logs / "prefect-server.log",
                "SIGTERM",
            )
        )
        status("creating or upgrading the MLflow store")
        run_step(
            mlflow_upgrade_command(store_uri),
            env("mlflow-server"),
            logs / "mlflow-server.log",
            f"mlflow db upgrade {store_uri}",
            timeout_s,
        )
        status("starting the MLflow server")
        mlflow = started(
            start_process(
                "mlflow-server",
                "mlflow-server",
                mlflow_server_command(store_uri, state.artifacts_dir, mlflow_port),
                env("mlflow-server"),
                logs / "mlflow-server.log",
                "SIGTERM",
            )
        )
        status("waiting for the Prefect server")
        wait_until(
            {"the Prefect server": (lambda: prefect_healthy(state.prefect_api_url), prefect)}, timeout_s
        )
        status("creating the work pools and registering the deployments")
        output = run_step(
            deploy_command(state.prefect_api_url, launch_pool),
            env("worker"),
            logs / "deploy.log",
            "registering the deployments",
            DEPLOY_TIMEOUT_S,
        )
        state.deployments = last_json_line(output)
        write_state(state)
        status("starting the workers")
        workers = [
            started(
                start_process(
                    f"worker-{pool}",
                    "worker",
                    worker_command(pool),
                    env("worker"),
                    logs / f"worker-{pool}.log",
                    "SIGINT",
                )
            )
            for pool in state.work_pools
        ]
        dashboard = None
        if ui_port is not None:
            # The dashboard only reads the platform tables: create them now, or it would answer 503
            # ("unable to open database file") until a first run created them. MLflow migrated its own
            # store in a process of its own (`mlflow db upgrade`), so this process's Alembic is free.
            status("creating the platform database")
            from pipelinerl.platform.tracking.store import PlatformStore  # noqa: PLC0415 (SQLAlchemy: for `up` only; `pipelinerl run` imports this module)

            PlatformStore(env("dashboard")["PIPELINERL_DATABASE_URL"]).close()
            status("starting the dashboard")
            state.dashboard_url = f"http://{HOST}:{ui_port}"
            dashboard = started(
                start_process(
                    "dashboard",
                    "dashboard",
                    dashboard_command(home, ui_port, state.mlflow_url, state.prefect_ui_url),
                    env("dashboard"),
                    logs / "dashboard.log",
                    "SIGTERM",
                )
            )
        status("waiting for the MLflow server, the workers and the dashboard")
        checks: dict[str, tuple[Callable[[], bool], StackProcess]] = {
            "the MLflow server": (lambda: mlflow_healthy(state.mlflow_url), mlflow)
        }
        if dashboard is not None:
            checks["the dashboard"] = (lambda: _http_ok(f"{state.dashboard_url}/api/health"), dashboard)
        for pool, proc in zip(state.work_pools, workers, strict=True):
            checks[f"the worker of pool {pool!r}"] = (
                partial(worker_online, state.prefect_api_url, pool, worker_name(pool)),
                proc,
            )
        wait_until(checks, timeout_s)
    except BaseException:
        stop_processes(state.processes)
        state_path(home).unlink(missing_ok=True)
        raise
    state.ready = True
    write_state(state)
    return state


def last_json_line(output: str) -> dict[str, str]:
    for line in reversed(output.strip().splitlines()):
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                return {str(k): str(v) for k, v in value.items()}
    raise StackError(f"registering the deployments printed no result: {output[-500:]!r}")


def _signal_group(proc: StackProcess, signum: int) -> None:
    """Signal the recorded group, if its leader is still the recorded process or members remain."""
    if is_alive(proc) or group_members(proc.pgid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pgid, signum)


def _wait_gone(processes: list[StackProcess], timeout_s: float) -> list[StackProcess]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in processes if is_alive(p) or group_members(p.pgid)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def stop_processes(processes: Iterable[StackProcess], grace_s: float = STOP_GRACE_S) -> list[str]:
    """Stop the given processes (workers, then servers) and their groups; return the names that
    needed SIGKILL."""
    killed: list[str] = []
    for batch in stop_order(processes):
        for proc in batch:
            _signal_group(proc, getattr(signal, proc.stop_signal))
        for proc in _wait_gone(batch, grace_s):
            killed.append(proc.name)
            _signal_group(proc, signal.SIGKILL)
        _wait_gone(batch, 10.0)
    return killed


def down(home: Path, grace_s: float = STOP_GRACE_S) -> StackState | None:
    """Stop what ``<home>/stack/state.json`` lists and remove the file; ``None`` if there was none."""
    home = home.expanduser().resolve()
    state = read_state(home)
    if state is None:
        return None
    stop_processes(state.processes, grace_s)
    left = [p.name for p in state.processes if is_alive(p) or group_members(p.pgid)]
    if left:
        raise StackError(f"could not stop {', '.join(left)} (state kept in {state_path(home)})")
    state_path(home).unlink(missing_ok=True)
    return state
