"""Faults on a running namespace cluster (``flows/netns_cluster.py``), as the multi-host tests
inject them: a host's link cut and restored, or impaired by a delaying, dropping relay on its cable
(``flows/netns_relay.py``); a host killed outright; the head's Prefect server restarted; a stranger
host joining the cluster network. Each changes only the cluster's namespaces and records what it
started in the cluster's state, so ``down`` still removes everything.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping
from functools import partial

from pipelinerl.flows import stack
from pipelinerl.flows.netns_cluster import (
    ClusterState,
    head_url,
    host_call,
    http_ok,
    join_host,
    logs_dir,
    namespace_pids,
    remove_namespaces,
    run_ip,
    start_on,
    wait_for,
    write_state,
)
from pipelinerl.flows.netns_plan import (
    HEAD,
    PREFECT_PORT,
    ClusterHost,
    HostRole,
    add_host,
    host_env,
    prefect_server_command,
    server_env,
    set_link_command,
)
from pipelinerl.flows.stack_plan import STARTUP_TIMEOUT_S


def set_link(state: ClusterState, host: str, up: bool) -> None:
    """Cut (``up=False``) or restore ``host``'s link to the bridge."""
    command = set_link_command(state.plan, state.plan.host(host), up)
    if host in state.relays:  # the cable's far end is in the relay's namespace now
        command[2] = state.relays[host]
    run_ip(command, f"setting {host}'s link {'up' if up else 'down'}")


def impair_link(state: ClusterState, host: str, delay_ms: float, loss: float, seed: int = 0) -> None:
    """Put a delaying, dropping relay (``flows/netns_relay.py``) on ``host``'s cable: every frame
    to and from the host waits ``delay_ms`` and a ``loss`` fraction is dropped, each way."""
    from pipelinerl.flows.netns_relay import tx_checksum_off  # noqa: PLC0415 (fcntl, ctypes: here only)

    plan = state.plan
    target = plan.host(host)
    relay_ns = f"{plan.prefix}-r-{host}"
    for each in plan.hosts:  # frames must leave every host whole and at most an MTU long
        host_call(plan, each.name, partial(tx_checksum_off, "eth0"))
        run_ip(["ip", "-n", each.namespace, "link", "set", "eth0", "gso_max_segs", "1"], "limiting GSO")
    net, cable, wire = plan.bridge_namespace, target.bridge_port, f"r-{host}"[:15]
    for command in (
        ["ip", "netns", "add", relay_ns],
        ["ip", "-n", net, "link", "set", cable, "netns", relay_ns],
        ["ip", "-n", net, "link", "add", wire, "type", "veth", "peer", "name", "wire", "netns", relay_ns],
        ["ip", "-n", net, "link", "set", wire, "master", "br0", "up"],
        ["ip", "-n", relay_ns, "link", "set", cable, "promisc", "on", "up"],
        ["ip", "-n", relay_ns, "link", "set", "wire", "promisc", "on", "up"],
    ):
        run_ip(command, f"impairing {host}'s link")
    state.relays[host] = relay_ns
    relay = [
        sys.executable, "-m", "pipelinerl.flows.netns_relay", cable, "wire",
        "--delay-ms", str(delay_ms), "--loss", str(loss), "--seed", str(seed),
    ]  # fmt: skip
    proc = stack.start_process(
        f"relay-{host}", "dashboard", ["ip", "netns", "exec", relay_ns, *relay], dict(os.environ),
        logs_dir(plan.home) / f"relay-{host}.log", "SIGTERM",
    )  # fmt: skip
    state.processes.append(proc)
    write_state(state)


def clear_impairment(state: ClusterState, host: str) -> None:
    """Take the relay off ``host``'s cable: the cable goes back onto the bridge."""
    relay_ns = state.relays.pop(host)
    relay = next(p for p in state.processes if p.name == f"relay-{host}")
    stack.stop_processes([relay])
    state.processes.remove(relay)
    net, cable = state.plan.bridge_namespace, state.plan.host(host).bridge_port
    run_ip(["ip", "-n", relay_ns, "link", "set", cable, "netns", net], f"restoring {host}'s link")
    run_ip(["ip", "-n", net, "link", "set", cable, "master", "br0", "up"], f"restoring {host}'s link")
    remove_namespaces([relay_ns])
    write_state(state)


def kill_host(state: ClusterState, host: str) -> list[int]:
    """The host disappears: every process in its namespace is killed at once (SIGKILL), its worker
    included. Returns the pids killed."""
    namespace = state.plan.host(host).namespace
    pids = namespace_pids(namespace)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def restart_prefect_server(
    state: ClusterState,
    *,
    down_s: float = 0.0,
    env: Mapping[str, str] | None = None,
    timeout_s: float = STARTUP_TIMEOUT_S,
) -> float:
    """Stop the head's Prefect server (SIGTERM to its group), leave it down ``down_s``, start it again
    on the same database and wait until it answers; returns the seconds its API was away."""
    plan = state.plan
    head = plan.host(HEAD)
    old = next(p for p in state.processes if p.name == "prefect-server")
    stopped_at = time.monotonic()
    stack.stop_processes([old])
    state.processes.remove(old)
    time.sleep(down_s)
    base = host_env(plan, head, env if env is not None else os.environ)
    new = start_on(
        state, head, "prefect-server", prefect_server_command(head), server_env(plan, base), "SIGTERM"
    )
    health = head_url(plan, PREFECT_PORT, "/api/health")
    wait_for(state, {"the Prefect server": (partial(http_ok, plan, health), new)}, timeout_s)
    return time.monotonic() - stopped_at


def join_stranger(state: ClusterState, name: str = "stranger", role: HostRole = "none") -> ClusterHost:
    """A host that joins the cluster network later (a stranger, or a spare node without a worker)."""
    host = add_host(state.plan, name, role)
    write_state(state)
    join_host(state.plan, host)
    return host
