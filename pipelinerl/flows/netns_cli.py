"""``pipelinerl dev cluster up|down|status|exec``: a small cluster of network namespaces on this
machine (``flows/netns_cluster.py``), to try a multi-host run before a real cluster. Needs root.

    sudo pipelinerl dev cluster up                   # head, trainer-0/1, actor-0/1/2 on 198.18.0.0/24
    sudo pipelinerl dev cluster exec head -- prefect deployment run rl-run/default --params "$(cat p.json)"
    sudo pipelinerl dev cluster down
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

console = Console()
cluster_app = typer.Typer(
    help="A cluster of network namespaces on this machine (hosts head, trainer-N, actor-N); needs root.",
    no_args_is_help=True,
)

HomeOption = Annotated[
    Path | None,
    typer.Option("--home", help="Shared directory of the cluster (default: run.home/dev-cluster)."),
]
PrefixOption = Annotated[
    str, typer.Option("--prefix", help="Namespace names are PREFIX-<host>; two clusters need two prefixes.")
]


def _home(home: Path | None) -> Path:
    if home is not None:
        return home
    from pipelinerl.platform.config import RunConfig

    return RunConfig().home / "dev-cluster"


def _fail(message: str) -> None:
    console.print(f"[red]error:[/red] {message}", soft_wrap=True, highlight=False)
    raise typer.Exit(1)


@cluster_app.command("up")
def up(
    home: HomeOption = None,
    prefix: PrefixOption = "plr",
    trainers: Annotated[int, typer.Option(min=1, max=8, help="Hosts trainer-0..N-1.")] = 2,
    actors: Annotated[int, typer.Option(min=1, max=8, help="Hosts actor-0..N-1.")] = 3,
) -> None:
    """Make the hosts and links, start PostgreSQL, Prefect, MLflow and the dashboard on head and a
    worker on every other host."""
    from pipelinerl.flows.netns_cluster import ClusterError
    from pipelinerl.flows.netns_cluster import up as cluster_up
    from pipelinerl.flows.netns_plan import default_hosts

    try:
        with console.status("making the cluster") as spinner:
            state = cluster_up(
                _home(home),
                prefix,
                hosts=default_hosts(trainers, actors),
                on_status=lambda text: spinner.update(text),
            )
    except (ClusterError, ValueError) as error:
        _fail(str(error))
        return
    _print_hosts(state)
    plan = state.plan
    console.print(
        f"Prefect API {plan.prefect_api_url}, MLflow {plan.mlflow_url}, dashboard {plan.dashboard_url} "
        f"(names known on the cluster's hosts only: `pipelinerl dev cluster exec head -- ...`); "
        f"logs in {plan.home / 'cluster' / 'logs'}; take it down with `pipelinerl dev cluster down"
        + (f" --prefix {prefix}" if prefix != "plr" else "")
        + (f" --home {home}`" if home is not None else "`"),
        soft_wrap=True,
        highlight=False,
    )


def _print_hosts(state: object) -> None:
    from pipelinerl.flows.netns_cluster import ClusterState, namespace_pids
    from pipelinerl.flows.netns_plan import worker_command

    assert isinstance(state, ClusterState)
    table = Table("host", "address", "namespace", "worker", "processes")
    for host in state.plan.hosts:
        worker = " ".join(worker_command(host)[3:]) if host.role != "none" else "-"
        table.add_row(
            host.name, host.address, host.namespace, worker, str(len(namespace_pids(host.namespace)))
        )
    console.print(table)


@cluster_app.command("status")
def status(home: HomeOption = None) -> None:
    """The cluster's hosts, their addresses and how many processes each runs."""
    from pipelinerl.flows.netns_cluster import read_state

    state = read_state(_home(home).expanduser().resolve())
    if state is None:
        _fail(f"no cluster is recorded in {_home(home)}")
        return
    _print_hosts(state)


@cluster_app.command("down")
def down(home: HomeOption = None, prefix: PrefixOption = "plr") -> None:
    """Kill every process on the cluster's hosts and remove its namespaces and links."""
    from pipelinerl.flows.netns_cluster import ClusterError
    from pipelinerl.flows.netns_cluster import down as cluster_down

    try:
        with console.status("taking the cluster down"):
            removed = cluster_down(_home(home), prefix)
    except (ClusterError, ValueError) as error:
        _fail(str(error))
        return
    if not removed:
        console.print(f"no cluster with prefix {prefix!r} is up", highlight=False)
        return
    console.print(f"removed {len(removed)} namespaces: {', '.join(removed)}", highlight=False)


@cluster_app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_(
    context: typer.Context,
    host: Annotated[str, typer.Argument(help="The host to run on (head, trainer-0, actor-1, ...).")],
    home: HomeOption = None,
) -> None:
    """Run a command as a process of HOST, with the cluster's environment (PREFECT_API_URL, ...)."""
    from pipelinerl.flows.netns_cluster import read_state
    from pipelinerl.flows.netns_plan import host_env, on_host

    state = read_state(_home(home).expanduser().resolve())
    if state is None:
        _fail(f"no cluster is recorded in {_home(home)}")
        return
    try:
        target = state.plan.host(host)
    except KeyError as error:
        _fail(str(error.args[0]))
        return
    command = list(context.args)
    if not command:
        _fail("give the command after `--`")
    bindir = str(Path(sys.executable).parent)
    env = host_env(state.plan, target, os.environ)
    env["PATH"] = f"{bindir}:{env.get('PATH', '')}"  # this environment's prefect, mlflow, pipelinerl
    os.execvpe("ip", on_host(target, command), env)
