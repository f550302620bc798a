"""A small cluster on one machine, for real: hosts as network namespaces (``flows/netns_plan.py``
plans it), the platform's services on ``head`` and a Prefect worker on every other host.

``up(home)`` makes the namespaces, the bridge and the links, writes each host's ``/etc/hosts``,
starts the Prefect server, the MLflow server and the dashboard on ``head`` (bound to its cluster
address), registers the deployments through the head's API, starts the workers (each pointed at
``http://head:4200/api``), waits until each answers, and records everything in
``<home>/cluster/state.json``. ``down(home)`` kills every process in the cluster's namespaces and
deletes the namespaces (their links go with them) and their ``/etc/netns`` files; it also works
after an interrupted ``up`` or test, from the state file or from the prefix alone.

The machine's own network namespace is never touched. This needs root (CAP_NET_ADMIN).
``host_call`` runs a function in a thread that joined a host's network namespace, so this process
can reach the head's services (by address: this process's /etc/hosts is the machine's). What the
tests do to a running cluster (links cut or impaired, hosts killed, the Prefect server restarted, a
stranger joining) is in ``flows/netns_faults.py``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, Field

from pipelinerl.flows import stack
from pipelinerl.flows.netns_plan import (
    HEAD,
    MLFLOW_PORT,
    PREFECT_PORT,
    UI_PORT,
    ClusterHost,
    ClusterPlan,
    HostRole,
    bridge_commands,
    check_prefix,
    dashboard_command,
    db_upgrade_command,
    deploy_command,
    host_env,
    hosts_file,
    link_commands,
    mlflow_server_command,
    on_host,
    pg_hba_line,
    plan_cluster,
    postgres_commands,
    postgres_ready_command,
    prefect_server_command,
    server_env,
    worker_command,
    worker_name,
    worker_pool,
)
from pipelinerl.flows.stack_plan import (
    DEPLOY_TIMEOUT_S,
    STARTUP_TIMEOUT_S,
    StackProcess,
    mlflow_server_env,
    tool,
)
from pipelinerl.platform.atomic_file import write_atomically

T = TypeVar("T")
NETNS_DIR = Path("/run/netns")
NETNS_ETC = Path("/etc/netns")
CLONE_NEWNET = 0x40000000
KILL_WAIT_S = 15.0


class ClusterError(RuntimeError):
    """The cluster cannot be made, started or removed; the message is meant for the user as is."""


class ClusterState(BaseModel):
    plan: ClusterPlan
    processes: list[StackProcess] = Field(default_factory=list)
    relays: dict[str, str] = Field(
        default_factory=dict, description="Host -> the namespace of the relay that impairs its link."
    )
    deployments: dict[str, str] = Field(default_factory=dict)
    ready: bool = False


def state_path(home: Path) -> Path:
    return home / "cluster" / "state.json"


def logs_dir(home: Path) -> Path:
    return home / "cluster" / "logs"


def read_state(home: Path) -> ClusterState | None:
    path = state_path(home)
    return ClusterState.model_validate_json(path.read_text()) if path.exists() else None


def write_state(state: ClusterState) -> None:
    path = state_path(state.plan.home)
    write_atomically(path, state.model_dump_json(indent=2), make_parents=True)


# ----- namespaces -----


def run_ip(command: Sequence[str], what: str) -> None:
    done = subprocess.run(list(command), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ClusterError(f"{what}: `{' '.join(command)}` failed: {done.stderr.strip() or done.returncode}")


def namespaces_with_prefix(prefix: str) -> list[str]:
    """The cluster's namespaces that exist now (``<prefix>-*``)."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(f"{prefix}-"))


def namespace_pids(namespace: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False)
    return [int(word) for word in done.stdout.split() if word.isdigit()]


def cannot_make_namespaces() -> str | None:
    """Why this machine cannot make network namespaces (not root, no ``ip``), or None."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root (CAP_NET_ADMIN)"
    probe = f"plrprobe{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"`ip netns add` failed: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def make_network(plan: ClusterPlan) -> None:
    for command in bridge_commands(plan):
        run_ip(command, "making the cluster's bridge")
    for host in plan.hosts:
        join_host(plan, host)


def join_host(plan: ClusterPlan, host: ClusterHost) -> None:
    """Make ``host``'s namespace, cable it to the bridge, and write every host's /etc/hosts (a new
    name is known to all)."""
    run_ip(["ip", "netns", "add", host.namespace], f"making host {host.name}")
    for command in link_commands(plan, host):
        run_ip(command, f"linking host {host.name}")
    text = hosts_file(plan)
    for each in plan.hosts:
        if (NETNS_DIR / each.namespace).exists():
            directory = NETNS_ETC / each.namespace
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "hosts").write_text(text)


def kill_namespace(namespace: str, grace_s: float = KILL_WAIT_S) -> None:
    """Every process in ``namespace``: SIGTERM, then SIGKILL for what is left after ``grace_s``."""
    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        pids = namespace_pids(namespace)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + wait_s
        while pids and time.monotonic() < deadline:
            for child in list(stack._CHILDREN):
                stack.reap(child)
            pids = [pid for pid in namespace_pids(namespace) if _alive(pid)]
            if pids:
                time.sleep(0.2)
        if not pids:
            return


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def remove_namespaces(namespaces: Sequence[str], grace_s: float = KILL_WAIT_S) -> None:
    for namespace in namespaces:
        if (NETNS_DIR / namespace).exists():
            kill_namespace(namespace, grace_s)
    for namespace in namespaces:
        if (NETNS_DIR / namespace).exists():
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
        shutil.rmtree(NETNS_ETC / namespace, ignore_errors=True)


def postgres_bindir() -> Path | None:
    """The newest PostgreSQL server binaries installed (Debian's layout), or None."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    usable = [p for p in found if (p / "postgres").exists() and (p / "initdb").exists()]
    return usable[-1] if usable and shutil.which("runuser") else None


def _postgres_home(prefix: str) -> Path:
    """A directory the ``postgres`` user may use (the cluster's home may be private to root)."""
    directory = Path(tempfile.mkdtemp(prefix=f"{prefix}-postgres-"))
    shutil.chown(directory, "postgres", "postgres")
    return directory


# ----- reaching a host from this process -----


def host_call(plan: ClusterPlan, host: str, work: Callable[[], T]) -> T:
    """``work()`` in a thread that has joined ``host``'s network namespace (only that thread moves;
    the sockets it opens stay there)."""
    result: list[T] = []
    failure: list[BaseException] = []
    path = NETNS_DIR / plan.host(host).namespace

    def run() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(path, os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {path} failed")
            finally:
                os.close(fd)
            result.append(work())
        except BaseException as error:  # handed to the caller
            failure.append(error)

    thread = threading.Thread(target=run, name=f"in-{host}", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def head_url(plan: ClusterPlan, port: int, path: str = "") -> str:
    """A head service as this process reaches it: by address (the head's name is in the cluster's
    hosts files, not in the machine's)."""
    return f"http://{plan.host(HEAD).address}:{port}{path}"


def http_ok(plan: ClusterPlan, url: str, from_host: str = HEAD) -> bool:
    def get() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=3) as response:
                return bool(200 <= response.status < 300)
        except (OSError, urllib.error.URLError):
            return False

    return host_call(plan, from_host, get)


def http_json(
    plan: ClusterPlan, url: str, body: Any = None, from_host: str = HEAD, timeout_s: float = 10
) -> Any:
    """GET (or POST ``body`` as JSON) ``url`` from ``from_host`` and decode the JSON answer."""

    def call() -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            url,
            data=data,
            headers={"Content-Type": "application/json"},
            method="GET" if body is None else "POST",
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read() or b"null")

    return host_call(plan, from_host, call)


def run_on(
    state: ClusterState,
    host: str,
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` to completion as a process of ``host`` (a user's shell there)."""
    target = state.plan.host(host)
    return subprocess.run(
        on_host(target, command),
        env=dict(env) if env is not None else host_env(state.plan, target, os.environ),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        cwd=stack.REPO_ROOT,
    )


# ----- up and down -----


def start_on(
    state: ClusterState, host: ClusterHost, name: str, command: list[str], env: Mapping[str, str], stop: str
) -> StackProcess:
    proc = stack.start_process(
        name,
        "worker" if name.endswith("worker") else "dashboard",
        on_host(host, command),
        env,
        logs_dir(state.plan.home) / f"{name}.log",
        stop,
    )
    state.processes.append(proc)
    write_state(state)  # at once: an interrupted `up` can still be taken down
    return proc


def _run_step(
    state: ClusterState,
    host: ClusterHost,
    command: list[str],
    env: Mapping[str, str],
    what: str,
    timeout_s: float,
) -> str:
    log = logs_dir(state.plan.home) / "steps.log"
    try:
        return stack.run_step(on_host(host, command), env, log, what, timeout_s)
    except stack.StackError as error:
        raise ClusterError(str(error)) from None


def wait_for(
    state: ClusterState, checks: Mapping[str, tuple[Callable[[], bool], StackProcess]], timeout_s: float
) -> None:
    try:
        stack.wait_until(checks, timeout_s)
    except stack.StackError as error:
        raise ClusterError(str(error)) from None


def up(
    home: Path,
    prefix: str = "plr",
    *,
    hosts: Sequence[tuple[str, HostRole]] | None = None,
    env: Mapping[str, str] | None = None,
    dashboard: bool = True,
    timeout_s: float = STARTUP_TIMEOUT_S,
    on_status: Callable[[str], None] | None = None,
) -> ClusterState:
    """Make the cluster and start its services and workers (see the module docstring). ``env``: the
    base environment of every host's processes (default: this process's). On any failure, what was
    made so far is removed again."""
    status = on_status or (lambda text: None)
    check_prefix(prefix)
    home = home.expanduser().resolve()
    if why := cannot_make_namespaces():
        raise ClusterError(f"cannot make a cluster on this machine: {why}")
    if existing := namespaces_with_prefix(prefix):
        raise ClusterError(
            f"namespaces {', '.join(existing)} exist already: a cluster with prefix {prefix!r} is "
            f"up; take it down with `pipelinerl dev cluster down --prefix {prefix}`"
        )
    bindir = postgres_bindir()
    plan = plan_cluster(home, prefix, hosts, _postgres_home(prefix) if bindir is not None else None)
    state = ClusterState(plan=plan)
    write_state(state)
    base = dict(env if env is not None else os.environ)
    try:
        status("making the hosts and their links")
        make_network(plan)
        for host in plan.hosts:
            Path(host_env(plan, host, {})["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
        head = plan.host(HEAD)
        head_env = host_env(plan, head, base)
        if bindir is not None:
            status("starting PostgreSQL on head")
            _start_postgres(state, bindir, head_env, timeout_s)
        status("starting the Prefect server on head")
        prefect = start_on(
            state, head, "prefect-server", prefect_server_command(head), server_env(plan, head_env), "SIGTERM"
        )
        status("creating or upgrading the MLflow store")
        _run_step(
            state,
            head,
            [tool("mlflow"), "db", "upgrade", plan.mlflow_store_uri],
            head_env,
            "mlflow db upgrade",
            timeout_s,
        )
        mlflow = start_on(
            state,
            head,
            "mlflow-server",
            mlflow_server_command(plan, head),
            mlflow_server_env(head_env),
            "SIGTERM",
        )
        checks: dict[str, tuple[Callable[[], bool], StackProcess]] = {
            "the MLflow server": (partial(http_ok, plan, head_url(plan, MLFLOW_PORT, "/health")), mlflow)
        }
        # The platform tables need only PostgreSQL: made beside the deployments' registration (one
        # after the other took 10 s more).
        with ThreadPoolExecutor(max_workers=1) as beside:
            tables = None
            if dashboard:
                command, what = db_upgrade_command(plan), "creating the platform tables"
                tables = beside.submit(_run_step, state, head, command, head_env, what, timeout_s)
            status("waiting for the Prefect server")
            wait_for(
                state,
                {
                    "the Prefect server": (
                        partial(http_ok, plan, head_url(plan, PREFECT_PORT, "/api/health")),
                        prefect,
                    )
                },
                timeout_s,
            )
            status("registering the deployments through the head's API")
            output = _run_step(
                state, head, deploy_command(plan), head_env, "registering the deployments", DEPLOY_TIMEOUT_S
            )
            state.deployments = stack.last_json_line(output)
            if tables is not None:
                tables.result()
        status("starting the dashboard and the workers")
        if dashboard:
            ui = start_on(state, head, "dashboard", dashboard_command(plan, head), head_env, "SIGTERM")
            checks["the dashboard"] = (partial(http_ok, plan, head_url(plan, UI_PORT, "/api/health")), ui)
        for host in plan.hosts:
            if host.role != "none":
                proc = start_on(
                    state, host, worker_name(host), worker_command(host), host_env(plan, host, base), "SIGINT"
                )
                checks[f"the worker on {host.name}"] = (partial(_worker_online, plan, host), proc)
        status("waiting for the MLflow server, the dashboard and the workers")
        wait_for(state, checks, timeout_s)
    except BaseException:
        _teardown(state)
        raise
    state.ready = True
    write_state(state)
    return state


def _start_postgres(state: ClusterState, bindir: Path, env: Mapping[str, str], timeout_s: float) -> None:
    plan = state.plan
    head = plan.host(HEAD)
    initdb, server, createdb = postgres_commands(plan, bindir)
    _run_step(state, head, initdb, env, "initdb", timeout_s)
    with (plan.postgres_dir / "data" / "pg_hba.conf").open("a") as hba:  # type: ignore[operator]
        hba.write(f"\n{pg_hba_line()}\n")
    proc = start_on(state, head, "postgres", server, env, "SIGTERM")

    def ready() -> bool:
        command = on_host(head, postgres_ready_command(plan, bindir))
        return subprocess.run(command, capture_output=True, check=False).returncode == 0

    wait_for(state, {"PostgreSQL": (ready, proc)}, timeout_s)
    for command in createdb:
        _run_step(state, head, command, env, f"creating database {command[-1]}", timeout_s)


def _worker_online(plan: ClusterPlan, host: ClusterHost) -> bool:
    api = head_url(plan, PREFECT_PORT, "/api")
    return host_call(plan, HEAD, partial(stack.worker_online, api, worker_pool(host), worker_name(host)))


def _teardown(state: ClusterState, grace_s: float = KILL_WAIT_S) -> None:
    # Workers first (SIGINT: they cancel their flow runs' processes), then whatever is left.
    workers = [p for p in state.processes if p.role == "worker"]
    for proc in workers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pgid, signal.SIGINT)
    namespaces = [*state.relays.values(), *reversed(state.plan.namespaces)]
    remove_namespaces(namespaces, grace_s)
    for proc in state.processes:
        stack.reap(proc.pid)
    if state.plan.postgres_dir is not None:
        shutil.rmtree(state.plan.postgres_dir, ignore_errors=True)


def down(home: Path | None = None, prefix: str | None = None, grace_s: float = KILL_WAIT_S) -> list[str]:
    """Remove the cluster recorded in ``<home>/cluster/state.json`` and/or every namespace named
    ``<prefix>-*``; return the namespaces removed. Leaves no namespace, link or process of it."""
    removed: list[str] = []
    state = read_state(home.expanduser().resolve()) if home is not None else None
    if state is not None:
        removed += [ns for ns in state.plan.namespaces if (NETNS_DIR / ns).exists()]
        _teardown(state, grace_s)
        state_path(state.plan.home).unlink(missing_ok=True)
    if prefix is not None:
        left = namespaces_with_prefix(check_prefix(prefix))
        removed += left
        remove_namespaces(left, grace_s)
    return sorted(set(removed))
