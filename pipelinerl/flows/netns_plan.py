"""A small cluster on one machine, planned without I/O: hosts as Linux network namespaces.

Each host is a network namespace (its own interfaces, loopback and ports) with its own host name
(a UTS namespace per process) and its own ``/etc/hosts`` (``ip netns exec`` mounts
``/etc/netns/<namespace>/hosts`` over it); the file system stays shared, as a cluster's shared
storage. A bridge in a namespace of its own joins the hosts, one veth pair each:

    <prefix>-net:  br0 ── v-head, v-trainer-0, ..., v-actor-2
    <prefix>-head: eth0 198.18.0.1/24        <prefix>-trainer-0: eth0 198.18.0.10/24 ...

Addresses come from 198.18.0.0/15 (RFC 2544: reserved for network benchmark tests); no host has a
default route, and nothing is added to the machine's own namespace, so no packet leaves the machine.

What runs where (``flows/netns_cluster.py`` starts it):

* ``head``: PostgreSQL (databases ``prefect``, ``mlflow``, ``pipelinerl``; SQLite files where the
  machine has no PostgreSQL server binaries), the Prefect server, the MLflow server, the dashboard,
  and the worker of the launch pool (``rl-run`` runs there, as on a cluster's CPU node);
* ``trainer-N``: a process worker of pool ``trainers`` polling its own work queue ``trainer-N`` (a
  run pins trainer node N there with ``cluster.trainer_work_queues``: node 0 must run where
  ``transport.host`` points); ``trainer-0`` also polls the pool's default queue;
* ``actor-N``: a process worker of pool ``actors``, one flow run at a time (``--limit 1``), so the
  actor nodes of a run land on different hosts and a spare host takes a role when one dies;
* extra hosts (``stranger``) join the bridge with an address and no worker.

Every worker reaches the head by name (``http://head:4200/api``), never by localhost.
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from pipelinerl.flows.deploy import LAUNCH_POOL
from pipelinerl.flows.stack_plan import tool

NETWORK = ipaddress.ip_network("198.18.0.0/24")  # inside 198.18.0.0/15, reserved for benchmark tests
DEFAULT_PREFIX = "plr"
BRIDGE = "br0"
HOST_INTERFACE = "eth0"
PREFECT_PORT = 4200
MLFLOW_PORT = 5000
UI_PORT = 8300
POSTGRES_PORT = 5432
DATABASES = ("prefect", "mlflow", "pipelinerl")
HEAD = "head"
# Linux limits interface names to 15 characters and network namespace names to a path component;
# the prefix keeps two clusters (two test workers, a person's and a test's) apart.
MAX_PREFIX = 8

HostRole = Literal["head", "trainers", "actors", "none"]


class ClusterHost(BaseModel):
    name: str = Field(description="Its host name, in every host's /etc/hosts.")
    role: HostRole = Field(description="The pool its worker polls (head: the launch pool), or none.")
    address: str
    namespace: str

    @property
    def bridge_port(self) -> str:
        """The veth end on the bridge (at most 15 characters)."""
        return f"v-{self.name}"[:15]


class ClusterPlan(BaseModel):
    prefix: str
    home: Path = Field(description="Shared by every host: logs, Prefect homes, the databases, runs.")
    hosts: list[ClusterHost]
    postgres_dir: Path | None = Field(
        None, description="The head's PostgreSQL data directory (None: SQLite files in the home)."
    )

    @property
    def bridge_namespace(self) -> str:
        return f"{self.prefix}-net"

    @property
    def namespaces(self) -> list[str]:
        return [self.bridge_namespace, *(host.namespace for host in self.hosts)]

    def host(self, name: str) -> ClusterHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no host {name!r} in the cluster (hosts: {', '.join(h.name for h in self.hosts)})")

    @property
    def prefect_api_url(self) -> str:
        return f"http://{HEAD}:{PREFECT_PORT}/api"

    @property
    def mlflow_url(self) -> str:
        return f"http://{HEAD}:{MLFLOW_PORT}"

    @property
    def dashboard_url(self) -> str:
        return f"http://{HEAD}:{UI_PORT}"

    def _postgres(self, database: str, driver: str = "") -> str:
        return f"postgresql{driver}://postgres@{HEAD}:{POSTGRES_PORT}/{database}"

    @property
    def database_url(self) -> str:
        """The platform database, as every host reaches it."""
        if self.postgres_dir is None:
            return f"sqlite:///{self.home / 'platform.db'}"
        return self._postgres("pipelinerl")

    @property
    def mlflow_store_uri(self) -> str:
        if self.postgres_dir is None:
            return f"sqlite:///{self.home / 'mlflow.db'}"
        return self._postgres("mlflow")

    @property
    def prefect_database_url(self) -> str | None:
        """The Prefect server's database (None: SQLite in the head's Prefect home)."""
        return None if self.postgres_dir is None else self._postgres("prefect", "+asyncpg")


def check_prefix(prefix: str) -> str:
    if not prefix or len(prefix) > MAX_PREFIX or not prefix.replace("-", "").isalnum():
        raise ValueError(
            f"cluster prefix {prefix!r}: give 1-{MAX_PREFIX} letters, digits or '-' (namespace names "
            f"are <prefix>-<host>)"
        )
    return prefix


def default_hosts(trainers: int = 2, actors: int = 3) -> list[tuple[str, HostRole]]:
    return [
        (HEAD, "head"),
        *((f"trainer-{k}", "trainers") for k in range(trainers)),
        *((f"actor-{k}", "actors") for k in range(actors)),
    ]


def plan_cluster(
    home: Path,
    prefix: str = DEFAULT_PREFIX,
    hosts: Sequence[tuple[str, HostRole]] | None = None,
    postgres_dir: Path | None = None,
) -> ClusterPlan:
    """Addresses in host order: head .1, trainers from .10, actors from .20, others from .100."""
    check_prefix(prefix)
    firsts = {"head": 1, "trainers": 10, "actors": 20, "none": 100}
    taken: dict[HostRole, int] = {}
    planned = []
    for name, role in hosts if hosts is not None else default_hosts():
        offset = firsts[role] + taken.get(role, 0)
        taken[role] = taken.get(role, 0) + 1
        planned.append(
            ClusterHost(name=name, role=role, address=str(NETWORK[offset]), namespace=f"{prefix}-{name}")
        )
    return ClusterPlan(prefix=prefix, home=home, hosts=planned, postgres_dir=postgres_dir)


def add_host(plan: ClusterPlan, name: str, role: HostRole = "none") -> ClusterHost:
    """A host joined later (a stranger on the cluster network, a replacement node)."""
    used = {host.address for host in plan.hosts}
    offset = next(k for k in range(100, 250) if str(NETWORK[k]) not in used)
    host = ClusterHost(name=name, role=role, address=str(NETWORK[offset]), namespace=f"{plan.prefix}-{name}")
    plan.hosts.append(host)
    return host


def hosts_file(plan: ClusterPlan) -> str:
    """What an operator writes in every host's /etc/hosts: loopback, then each host by name."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{host.address}\t{host.name}" for host in plan.hosts]
    return "\n".join(lines) + "\n"


# ----- `ip` command lines -----


def link_commands(plan: ClusterPlan, host: ClusterHost) -> list[list[str]]:
    """Join ``host`` to the bridge: a veth pair made in the bridge's namespace with its other end in
    the host's, the address on it, loopback up. No route beyond the cluster's /24."""
    net, ns = plan.bridge_namespace, host.namespace
    return [
        [
            "ip",
            "-n",
            net,
            "link",
            "add",
            host.bridge_port,
            "type",
            "veth",
            "peer",
            "name",
            HOST_INTERFACE,
            "netns",
            ns,
        ],
        ["ip", "-n", net, "link", "set", host.bridge_port, "master", BRIDGE, "up"],
        ["ip", "-n", ns, "addr", "add", f"{host.address}/{NETWORK.prefixlen}", "dev", HOST_INTERFACE],
        ["ip", "-n", ns, "link", "set", HOST_INTERFACE, "up"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
    ]


def bridge_commands(plan: ClusterPlan) -> list[list[str]]:
    net = plan.bridge_namespace
    return [
        ["ip", "netns", "add", net],
        ["ip", "-n", net, "link", "add", BRIDGE, "type", "bridge"],
        ["ip", "-n", net, "link", "set", BRIDGE, "up"],
    ]


def set_link_command(plan: ClusterPlan, host: ClusterHost, up: bool) -> list[str]:
    """Cut (or restore) ``host``'s cable: its port on the bridge goes down (up)."""
    return ["ip", "-n", plan.bridge_namespace, "link", "set", host.bridge_port, "up" if up else "down"]


def on_host(host: ClusterHost, command: Sequence[str]) -> list[str]:
    """``command`` as a process of ``host``: in its network namespace (and its /etc/hosts), with its
    host name in a UTS namespace of its own. Each step execs the next, so the pid is the command's."""
    return [
        "ip",
        "netns",
        "exec",
        host.namespace,
        "unshare",
        "--uts",
        "--",
        "sh",
        "-c",
        'hostname "$0" && exec "$@"',
        host.name,
        *command,
    ]


# ----- what runs on the hosts -----


def host_env(plan: ClusterPlan, host: ClusterHost, base: Mapping[str, str]) -> dict[str, str]:
    """A host's processes: their own Prefect home, the head's API, MLflow server and the platform
    database (on the shared file system, as a cluster's shared storage would hold it)."""
    env = {k: v for k, v in base.items() if not k.lower().endswith("_proxy")}  # no proxy on the cluster
    env.update(
        PREFECT_HOME=str(plan.home / "hosts" / host.name / "prefect"),
        PREFECT_API_URL=plan.prefect_api_url,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PYTHONUNBUFFERED="1",
        MLFLOW_TRACKING_URI=plan.mlflow_url,
        PIPELINERL_DATABASE_URL=plan.database_url,
    )
    return env


def server_env(plan: ClusterPlan, env: Mapping[str, str]) -> dict[str, str]:
    """The head's Prefect server keeps its database in the head's Prefect home; its UI calls the API
    by the head's name."""
    server = dict(env)
    server.update(PREFECT_UI_API_URL=plan.prefect_api_url)
    if plan.prefect_database_url is not None:
        server["PREFECT_API_DATABASE_CONNECTION_URL"] = plan.prefect_database_url
    return server


def postgres_commands(plan: ClusterPlan, bindir: Path) -> tuple[list[str], list[str], list[list[str]]]:
    """(initdb, the server, one createdb per database), each as the ``postgres`` user (the server
    refuses root). The server listens on the head's cluster address, its socket in its directory."""
    assert plan.postgres_dir is not None
    data = str(plan.postgres_dir / "data")
    as_postgres = ["runuser", "-u", "postgres", "--"]
    initdb = [
        *as_postgres,
        str(bindir / "initdb"),
        "-D",
        data,
        "-U",
        "postgres",
        "--auth=trust",
        "-E",
        "UTF8",
    ]
    head = plan.host(HEAD)
    server = [
        *as_postgres,
        str(bindir / "postgres"),
        "-D",
        data,
        "-h",
        head.address,
        "-p",
        str(POSTGRES_PORT),
        "-k",
        str(plan.postgres_dir),
        "-c",
        "max_connections=200",
        "-c",
        "synchronous_commit=off",  # a crash may lose the last commits, never corrupt: a test cluster
    ]
    createdb = [
        [*as_postgres, str(bindir / "createdb"), "-h", head.address, "-p", str(POSTGRES_PORT), name]
        for name in DATABASES
    ]
    return initdb, server, createdb


def pg_hba_line() -> str:
    """Every host of the cluster network may connect without a password (a trusted test network)."""
    return f"host all all {NETWORK} trust"


def postgres_ready_command(plan: ClusterPlan, bindir: Path) -> list[str]:
    return [str(bindir / "pg_isready"), "-q", "-h", plan.host(HEAD).address, "-p", str(POSTGRES_PORT)]


def prefect_server_command(host: ClusterHost) -> list[str]:
    return [tool("prefect"), "server", "start", "--host", host.address, "--port", str(PREFECT_PORT)]


def mlflow_server_command(plan: ClusterPlan, host: ClusterHost) -> list[str]:
    # MLflow answers only the Host headers it is told (DNS-rebinding protection): the head's name.
    allowed = ",".join([f"{HEAD}", f"{HEAD}:{MLFLOW_PORT}", host.address, f"{host.address}:{MLFLOW_PORT}"])
    return [
        tool("mlflow"),
        "server",
        "--backend-store-uri",
        plan.mlflow_store_uri,
        "--artifacts-destination",
        str(plan.home / "mlartifacts"),
        "--host",
        host.address,
        "--port",
        str(MLFLOW_PORT),
        "--workers",
        "1",
        "--allowed-hosts",
        allowed,
    ]


def dashboard_command(plan: ClusterPlan, host: ClusterHost) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pipelinerl.cli",
        "ui",
        "--host",
        host.address,
        "--port",
        str(UI_PORT),
        "--mlflow-ui-url",
        plan.mlflow_url,
        "--prefect-ui-url",
        f"http://{HEAD}:{PREFECT_PORT}",
        "--set",
        f"run.home={plan.home}",
    ]


def worker_name(host: ClusterHost) -> str:
    return f"{host.name}-worker"


def worker_pool(host: ClusterHost) -> str:
    return LAUNCH_POOL if host.role == "head" else host.role


def worker_command(host: ClusterHost) -> list[str]:
    command = [
        tool("prefect"),
        "worker",
        "start",
        "--pool",
        worker_pool(host),
        "--type",
        "process",
        "--name",
        worker_name(host),
    ]
    if host.role == "trainers":
        # Its own queue (node pinning); trainer-0 also takes what a run leaves on the default queue.
        queues = ["default", host.name] if host.name.endswith("-0") else [host.name]
        for queue in queues:
            command += ["--work-queue", queue]
    if host.role == "actors":
        command += ["--limit", "1"]
    return command


def db_upgrade_command(plan: ClusterPlan) -> list[str]:
    """Create or migrate the platform tables (the dashboard reads them; a first run would make them)."""
    return [sys.executable, "-m", "pipelinerl.cli", "db", "upgrade", "--url", plan.database_url]


def deploy_command(plan: ClusterPlan) -> list[str]:
    return [sys.executable, "-m", "pipelinerl.flows.deploy", "--api-url", plan.prefect_api_url]
