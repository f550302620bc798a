"""The namespace cluster's plan (pure): addresses, names, hosts files, command lines, environments."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from pipelinerl.flows.netns_plan import (
    NETWORK,
    add_host,
    check_prefix,
    host_env,
    hosts_file,
    link_commands,
    on_host,
    plan_cluster,
    server_env,
    worker_command,
)
from pipelinerl.platform.config import ConfigError, load_config

BENCHMARK_RANGE = ipaddress.ip_network("198.18.0.0/15")


def test_every_host_has_its_own_address_in_the_benchmark_range() -> None:
    plan = plan_cluster(Path("/shared"), "plr")
    names = [host.name for host in plan.hosts]
    assert names == ["head", "trainer-0", "trainer-1", "actor-0", "actor-1", "actor-2"]
    addresses = [ipaddress.ip_address(host.address) for host in plan.hosts]
    assert len(set(addresses)) == len(addresses)
    assert all(address in BENCHMARK_RANGE and address in NETWORK for address in addresses)
    assert all(host.namespace == f"plr-{host.name}" for host in plan.hosts)
    assert plan.bridge_namespace == "plr-net"
    assert all(len(host.bridge_port) <= 15 for host in plan.hosts), "Linux interface names"


def test_a_host_joined_later_takes_a_free_address_and_every_hosts_file_names_it() -> None:
    plan = plan_cluster(Path("/shared"), "plr")
    stranger = add_host(plan, "stranger")
    assert stranger.address not in {h.address for h in plan.hosts if h is not stranger}
    text = hosts_file(plan)
    assert f"{stranger.address}\tstranger" in text.splitlines()
    assert "127.0.0.1\tlocalhost" in text.splitlines()
    # No host name maps to loopback (Debian's 127.0.1.1 line would make a host unreachable by name).
    assert not any(line.startswith("127.0.1.1") for line in text.splitlines())


def test_links_join_the_bridge_and_add_no_route() -> None:
    plan = plan_cluster(Path("/shared"), "plr")
    host = plan.host("actor-1")
    commands = link_commands(plan, host)
    assert all(command[:3] in (["ip", "-n", "plr-net"], ["ip", "-n", "plr-actor-1"]) for command in commands)
    assert not any("route" in command for command in commands), "no default route: nothing leaves"
    assert ["ip", "-n", "plr-actor-1", "addr", "add", f"{host.address}/24", "dev", "eth0"] in commands


def test_workers_poll_their_pool_and_pin_what_must_be_pinned() -> None:
    plan = plan_cluster(Path("/shared"), "plr")
    head, trainer0, trainer1, actor0 = (plan.host(n) for n in ("head", "trainer-0", "trainer-1", "actor-0"))
    assert worker_command(head)[3:6] == ["--pool", "local", "--type"]
    assert worker_command(trainer0)[-4:] == ["--work-queue", "default", "--work-queue", "trainer-0"]
    assert worker_command(trainer1)[-2:] == ["--work-queue", "trainer-1"]
    assert worker_command(actor0)[-2:] == ["--limit", "1"], "one actor node per host"


def test_every_host_reaches_the_head_by_name_never_localhost() -> None:
    plan = plan_cluster(Path("/shared"), "plr", postgres_dir=Path("/tmp/pg"))
    env = host_env(plan, plan.host("actor-0"), {"HTTPS_PROXY": "http://proxy:3128", "PATH": "/bin"})
    assert env["PREFECT_API_URL"] == "http://head:4200/api"
    assert env["MLFLOW_TRACKING_URI"] == "http://head:5000"
    assert env["PIPELINERL_DATABASE_URL"] == "postgresql://postgres@head:5432/pipelinerl"
    assert "HTTPS_PROXY" not in env, "the cluster has no proxy"
    assert env["PREFECT_HOME"] == "/shared/hosts/actor-0/prefect"
    server = server_env(plan, env)
    assert server["PREFECT_API_DATABASE_CONNECTION_URL"] == "postgresql+asyncpg://postgres@head:5432/prefect"
    assert not any("localhost" in value or "127.0.0.1" in value for value in env.values())


def test_sqlite_where_there_is_no_postgresql() -> None:
    plan = plan_cluster(Path("/shared"), "plr")
    assert plan.database_url == "sqlite:////shared/platform.db"
    assert "PREFECT_API_DATABASE_CONNECTION_URL" not in server_env(plan, {})


def test_a_command_on_a_host_runs_in_its_namespace_under_its_name() -> None:
    plan = plan_cluster(Path("/shared"), "plr")
    wrapped = on_host(plan.host("trainer-0"), ["python", "-c", "pass"])
    assert wrapped[:4] == ["ip", "netns", "exec", "plr-trainer-0"]
    assert wrapped[-4:] == ["trainer-0", "python", "-c", "pass"]


@pytest.mark.parametrize("prefix", ["", "much-too-long", "a b", "x/y"])
def test_a_bad_prefix_is_refused_naming_it(prefix: str) -> None:
    with pytest.raises(ValueError, match="cluster prefix"):
        check_prefix(prefix)


def test_work_queues_must_name_one_queue_per_node() -> None:
    with pytest.raises(ConfigError, match=r"cluster\.trainer_work_queues.*cluster\.trainer_nodes=2"):
        load_config(
            None, ["cluster.trainer_nodes=2", "trainer.num_processes=2", 'cluster.trainer_work_queues=["a"]']
        )
    config = load_config(None, ['cluster.actor_work_queues=["actor-0"]'])
    assert config.cluster.work_queue("actor", 0) == "actor-0"
    assert config.cluster.work_queue("trainer", 0) is None
