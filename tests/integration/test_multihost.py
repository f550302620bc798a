"""One run over several hosts: network namespaces on this machine (``flows/netns_cluster.py``).

The cluster: ``head`` (PostgreSQL, Prefect, MLflow, the dashboard, the launch pool's worker),
``trainer-0``/``trainer-1`` (pool ``trainers``, one work queue each), ``actor-0..2`` (pool
``actors``, one flow run per worker), a bridge between them, addresses in 198.18.0.0/24, each host
its own /etc/hosts and host name. The run is launched as a user launches it: ``prefect deployment
run rl-run/default`` in a shell on ``head``, against the head's API by name. What crosses the link
is what crosses a real cluster's network: ZeroMQ with CurveZMQ, the weight group's gloo broadcast
and its store, DeepSpeed's rendezvous, Prefect's and MLflow's HTTP, PostgreSQL.

One run carries every check, one after the other, to keep the module within its few minutes of the
suite: the run across the hosts over impaired links, a stranger and a Prefect server restart while
it trains, then a link down for 15 s, then a trainer rank killed (the trainer role restarts on its
hosts while the actors' flow runs go on), then a host killed and the restart onto the spare.

Needs root (network namespaces); skips, saying why, where they cannot be made.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pipelinerl.flows import netns_cluster
from pipelinerl.flows.netns_cluster import (
    ClusterState,
    cannot_make_namespaces,
    head_url,
    host_call,
    http_json,
    namespace_pids,
    run_on,
)
from pipelinerl.flows.netns_faults import (
    clear_impairment,
    impair_link,
    join_stranger,
    kill_host,
    restart_prefect_server,
    set_link,
)
from pipelinerl.flows.netns_plan import MLFLOW_PORT, PREFECT_PORT, UI_PORT, plan_cluster
from pipelinerl.platform.config import load_config
from pipelinerl.platform.prompt_records import audit_run
from tests.conftest import wait_until

# The run has the machine's whole runs to itself (tests/scheduling.py): beside the vLLM learning run a
# slow 2-core machine took it past 900 s. Its waits share one deadline, FIXTURE_BUDGET_S; pytest's
# timeout is the bound on a hang outside them.
pytestmark = [pytest.mark.slow, pytest.mark.machine_alone, pytest.mark.timeout(1800)]

PREFIX = f"pt{os.environ.get('PYTEST_XDIST_WORKER', 'gw0')}"  # one cluster per test worker
FIXTURE_BUDGET_S = 1500.0  # a bound on a hang: the run takes two to four minutes, its cluster one
BASE_PORT = 21100  # every host has its own ports: no clash with the other test worker
WORKER_QUERY_S = "2"  # how often the workers look for flow runs (Prefect's default: 10 s)
ACTOR_HOSTS = ("actor-0", "actor-1", "actor-2")
IMPAIRED_DELAY_MS, IMPAIRED_LOSS = 50.0, 0.01  # on every actor link during the first run
# Long enough to go on after each fault: a link down for LINK_DOWN_S (which holds the run back) with,
# meanwhile, a stranger's attempts and a Prefect server restart; then a host killed and a restart.
# A step takes about half a second here (the random model): the faults, not the steps, take the time.
STEPS = 24
PREFECT_DOWN_S = 5.0  # the head's Prefect server stays stopped this long mid-run
LINK_DOWN_S = 15.0
HEARTBEAT_TIMEOUT_S = 15  # the run's cluster.heartbeat_timeout_s


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> ClusterState:
    if why := cannot_make_namespaces():
        pytest.skip(f"the multi-host tests make network namespaces: {why}")
    netns_cluster.down(prefix=PREFIX)  # what an interrupted earlier session left
    home = tmp_path_factory.mktemp("cluster")
    started = time.monotonic()
    state = netns_cluster.up(home, PREFIX, env=dict(os.environ, PREFECT_WORKER_QUERY_SECONDS=WORKER_QUERY_S))
    print(f"cluster up in {time.monotonic() - started:.1f} s")
    try:
        yield state
    finally:
        netns_cluster.down(home, PREFIX)
        assert netns_cluster.namespaces_with_prefix(PREFIX) == []


def api(state: ClusterState, path: str) -> str:
    return head_url(state.plan, PREFECT_PORT, f"/api{path}")


def flow_run(state: ClusterState, flow_run_id: str) -> dict[str, Any]:
    return http_json(state.plan, api(state, f"/flow_runs/{flow_run_id}"))


def running_stages(state: ClusterState, run_dir_name: str) -> list[tuple[str, str, int]]:
    """The run's stages running now, as (host, stage, pid): stage ``actor0``, ``trainer1`` (its rank),
    ``preprocessor``; the host from the namespace its process is in."""
    found = []
    for host in state.plan.hosts:
        for pid in namespace_pids(host.namespace):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            module = next((a for a in argv if a.startswith("pipelinerl.workers.")), None)
            if module is None or not any(run_dir_name in arg for arg in argv):
                continue
            stage = module.rsplit(".", 1)[1]
            if "--actor-id" in argv:
                stage += argv[argv.index("--actor-id") + 1]
            elif stage == "trainer":
                stage += _rank_of(pid)
            found.append((host.name, stage, pid))
    return found


def host_processes(state: ClusterState, run_dir_name: str) -> dict[str, set[str]]:
    """Host -> the run's stages running there now."""
    found: dict[str, set[str]] = {}
    for host, stage, _ in running_stages(state, run_dir_name):
        found.setdefault(host, set()).add(stage)
    return found


def stage_hosts(state: ClusterState, run_id: str) -> dict[str, str]:
    """Stage -> the host it runs on now."""
    return {stage: host for host, stages in host_processes(state, run_id).items() for stage in stages}


def _rank_of(pid: int) -> str:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return next((item[5:].decode() for item in environ if item.startswith(b"RANK=")), "?")


@dataclass
class MultiHostRun:
    flow_run_id: str
    run_dir: Path
    final: dict[str, Any]
    summary: dict[str, Any]
    placement: dict[str, set[str]] = field(default_factory=dict)  # host -> stages seen there
    stranger: dict[str, Any] = field(default_factory=dict)
    dashboard_live: dict[str, Any] | None = None  # the run as the dashboard listed it while running
    mlflow_live: dict[str, Any] | None = None  # its MLflow run while running
    prefect_away_s: float = 0.0  # how long the head's Prefect API was away mid-run
    version_at_prefect_restart: int = 0
    roles_after_prefect_restart: list[dict[str, Any]] = field(default_factory=list)
    cut_host: str = ""  # the host of actor1, whose link went down for LINK_DOWN_S
    versions_around_cut: tuple[int, int, int] = (0, 0, 0)  # at the cut, at the restore, progress seen after
    trainer_restart: dict[str, Any] = field(default_factory=dict)  # what the trainer rank's kill left
    killed_host: str = ""  # the host of actor0, whose every process was killed
    noticed_after_s: float = 0.0  # from the kill to the restarted attempt's actors running
    after: dict[str, set[str]] = field(default_factory=dict)  # host -> stages, after the restart


def launch_on_head(state: ClusterState, config: dict[str, Any]) -> str:
    """``prefect deployment run`` in a shell on head, as a user launches a run; returns its id."""
    done = run_on(
        state,
        "head",
        [
            str(Path(sys.executable).parent / "prefect"),
            "deployment",
            "run",
            "rl-run/default",
            "--params",
            json.dumps({"config": config}),
        ],
    )
    assert done.returncode == 0, done.stdout + done.stderr
    match = re.search(r"UUID:\s*([0-9a-f-]{36})", done.stdout)
    assert match, done.stdout
    return match.group(1)


def run_config(model: Path, directory: Path, *overrides: str) -> dict[str, Any]:
    config = load_config(
        None,
        [
            f"model.path={model}",
            f"run.output_dir={directory / 'runs'}",
            f"run.home={directory / 'home'}",
            "run.name=multihost",
            "rl.batch_size=16",
            "actor.max_in_flight=8",
            "task.eval_problems=16",
            "tracking.flush_interval_s=0.5",
            f"transport.base_port={BASE_PORT}",
            "transport.host=trainer-0",  # by name: each host's /etc/hosts says where it is
            "cluster.placement=pools",
            *overrides,
        ],
    )
    return config.model_dump(mode="json")


@pytest.fixture(scope="module")
def multihost_run(cluster, random_model_dir, tmp_path_factory) -> MultiHostRun:
    """Two trainer ranks on trainer-0 and trainer-1 (DeepSpeed's rendezvous and gloo across the
    link), the preprocessor on trainer-0, one actor on each of two actor hosts, every actor host's
    link delayed 50 ms each way and dropping 1 % (a relay on its cable); a restart allowed, a
    checkpoint every 2 steps. While it trains, one after the other: a stranger on the bridge tries the
    run's sockets while the head's Prefect server stops and starts again, and the dashboard and MLflow
    are read; actor1's host loses its link for 15 s; once the run has gone on, every process of
    actor0's host is killed (its worker with them), as a host that disappears."""
    directory = tmp_path_factory.mktemp("multihost-run")
    config = run_config(
        random_model_dir,
        directory,
        f"run.max_steps={STEPS}",
        "trainer.num_processes=2",
        "cluster.trainer_nodes=2",
        'cluster.trainer_work_queues=["trainer-0","trainer-1"]',
        "actor.num_actors=2",
        "cluster.actor_nodes=2",
        "run.max_restarts=2",
        "trainer.checkpoint_every=2",
        f"cluster.heartbeat_timeout_s={HEARTBEAT_TIMEOUT_S}",
        "run.stall_timeout_s=300",
    )
    for seed, host in enumerate(ACTOR_HOSTS):
        impair_link(cluster, host, delay_ms=IMPAIRED_DELAY_MS, loss=IMPAIRED_LOSS, seed=seed)
    started = time.monotonic()

    def phase(what: str) -> None:  # shown with a failure: where the time went
        print(f"{time.monotonic() - started:6.1f} s  {what}")

    def left() -> float:
        return max(1.0, started + FIXTURE_BUDGET_S - time.monotonic())

    def still_running() -> None:
        """Fails at once, saying why, where the run has ended before the fixture expected it to."""
        state = flow_run(cluster, flow_run_id)["state"]
        assert state["type"] not in ("FAILED", "CRASHED", "CANCELLED"), state

    flow_run_id = launch_on_head(cluster, config)
    phase("launched")
    runs = directory / "runs"
    run = MultiHostRun(flow_run_id, Path(), {}, {})

    def training() -> Path | None:
        still_running()
        metrics = next(runs.glob("*/metrics.jsonl"), None)
        return metrics.parent if metrics is not None and metrics.stat().st_size else None

    run.run_dir = wait_until(training, left(), "the multi-host run to train a step", interval_s=0.5)
    phase("first step trained")
    run_id = run.run_dir.name

    def observe_placement() -> None:
        for host, stages in host_processes(cluster, run_id).items():
            run.placement.setdefault(host, set()).update(stages)

    # At once, while it trains: actor1's host loses its link for LINK_DOWN_S (which holds the run back:
    # the trainer's broadcast waits for every actor), a stranger tries the run's sockets, the head's
    # Prefect server goes away for a while and comes back on its database; meanwhile, what the head's
    # services show of the run.
    def both_actors() -> dict[str, str] | None:
        now = stage_hosts(cluster, run_id)
        return now if {"actor0", "actor1"} <= set(now) else None

    hosts = wait_until(both_actors, left(), "both actors to run", 0.5)
    phase("both actors run")
    run.cut_host, run.killed_host = hosts["actor1"], hosts["actor0"]
    stranger = join_stranger(cluster)
    probe: dict[str, Any] = {}
    around_cut: list[int] = []

    def cut() -> None:
        # The cut host's relay comes off first: TCP retransmits into a cut link with exponential
        # backoff, so a connection resumes only at its next retransmission after the link is back (at
        # about 51 s for a 30 s cut, 31 s for 15 s), and a retransmission the relay drops doubles that again.
        clear_impairment(cluster, run.cut_host)
        around_cut.append(last_version(run.run_dir))
        set_link(cluster, run.cut_host, up=False)
        time.sleep(LINK_DOWN_S)
        set_link(cluster, run.cut_host, up=True)
        around_cut.append(last_version(run.run_dir))

    def restart() -> None:
        run.version_at_prefect_restart = last_version(run.run_dir)
        run.prefect_away_s = restart_prefect_server(cluster, down_s=PREFECT_DOWN_S)
        run.roles_after_prefect_restart = role_flow_runs(cluster, run.run_dir)

    threads = [
        threading.Thread(target=cut),
        threading.Thread(
            target=lambda: probe.update(
                done=run_on(
                    cluster,
                    stranger.name,
                    [sys.executable, "-m", "tests.stranger", "trainer-0", str(BASE_PORT)],
                )
            )
        ),
        threading.Thread(target=restart),
    ]
    for thread in threads:
        thread.start()
    observe_placement()  # first, while surely running
    # Bounds on a hang: on a loaded 2-core machine the services answer in seconds, not milliseconds.
    listed = http_json(cluster.plan, head_url(cluster.plan, UI_PORT, "/api/runs"), timeout_s=120)["runs"]
    run.dashboard_live = next((r for r in listed if r["id"] == run_id), None)
    mlflow_run_id = (run.run_dir / "mlflow_run_id").read_text()
    run.mlflow_live = http_json(
        cluster.plan,
        head_url(cluster.plan, MLFLOW_PORT, f"/api/2.0/mlflow/runs/get?run_id={mlflow_run_id}"),
        timeout_s=120,
    )["run"]
    for thread in threads:
        while thread.is_alive():
            observe_placement()
            thread.join(0.5)
    phase("link back, stranger done, Prefect server back")
    done: subprocess.CompletedProcess[str] = probe["done"]
    assert done.returncode == 0, done.stdout + done.stderr
    run.stranger = json.loads(done.stdout.strip().splitlines()[-1])

    # The first attempt trains on after the link comes back (and after the Prefect server's restart).
    def at_version(version: int) -> int | None:
        still_running()
        observe_placement()
        reached = last_version(run.run_dir)
        return reached if reached >= version else None

    at_cut, at_restore = around_cut
    after_cut = wait_until(lambda: at_version(at_restore + 2), left(), "the run to go on after the link", 0.5)
    run.versions_around_cut = (at_cut, at_restore, after_cut)
    phase(f"went on after the link: versions {run.versions_around_cut}")

    # trainer1 (rank 1, on trainer-1) is killed: the trainer role restarts on its hosts, the actors'
    # flow runs go on with their engines.
    run.trainer_restart = restart_the_trainer_role(cluster, run, still_running, left)
    phase(f"trainer role restarted: {run.trainer_restart['summary']}")

    # actor0's host disappears; the run restarts with the actors on the live hosts.
    killed_at = time.monotonic()
    assert kill_host(cluster, run.killed_host), f"{run.killed_host} ran nothing"

    def restarted() -> dict[str, str] | None:
        still_running()
        now = stage_hosts(cluster, run_id)
        both = {"actor0", "actor1"} <= set(now) and run.killed_host not in now.values()
        return now if both and len(records(run.run_dir / "restarts.jsonl")) == 2 else None

    wait_until(restarted, left(), "the run to restart its actors on the live hosts", 0.5)
    run.noticed_after_s = time.monotonic() - killed_at
    phase(f"actors restarted on the live hosts, {run.noticed_after_s:.1f} s after the kill")

    def final() -> dict[str, Any] | None:
        for host, stages in host_processes(cluster, run_id).items():
            run.after.setdefault(host, set()).update(stages)
        answer = flow_run(cluster, flow_run_id)
        return answer if answer["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None

    run.final = wait_until(final, left(), "the multi-host run to end", interval_s=0.5)
    phase(f"ended: {run.final['state']['type']}")
    for host in list(cluster.relays):
        clear_impairment(cluster, host)
    summary = run.run_dir / "summary.json"
    run.summary = json.loads(summary.read_text()) if summary.exists() else {}
    return run


def stage_pids(state: ClusterState, run_dir_name: str) -> dict[str, int]:
    """Stage -> its process id now, on any host."""
    return {stage: pid for _, stage, pid in running_stages(state, run_dir_name)}


def restart_the_trainer_role(cluster: ClusterState, run: MultiHostRun, still_running, left) -> dict[str, Any]:
    """SIGKILL trainer rank 1 on its host; wait for the restarted trainer role to train two versions past
    the checkpoint it resumed from. What the actors' flow runs and processes were before and after."""
    run_id = run.run_dir.name

    def actor_flow_runs() -> dict[str, tuple[str, str]]:
        return {
            r["name"].rsplit("-", 1)[1]: (r["id"], r["state"]["type"])
            for r in role_flow_runs(cluster, run.run_dir)
            if r["name"].rsplit("-", 1)[1].startswith("actor")
        }

    before = {"flow_runs": actor_flow_runs(), "pids": stage_pids(cluster, run_id)}
    killed_at, version_at_kill = time.monotonic(), last_version(run.run_dir)
    os.kill(before["pids"]["trainer1"], signal.SIGKILL)

    def trained_after_the_restart() -> int | None:
        still_running()
        restarts = records(run.run_dir / "restarts.jsonl")
        if not restarts:
            return None
        reached = last_version(run.run_dir)
        return reached if reached >= restarts[0]["resumed_from_version"] + 2 else None

    wait_until(trained_after_the_restart, left(), "the restarted trainer role to train two versions", 0.5)
    after = {"flow_runs": actor_flow_runs(), "pids": stage_pids(cluster, run_id)}
    (restart,) = records(run.run_dir / "restarts.jsonl")
    took = time.monotonic() - killed_at
    return {
        "before": before,
        "after": after,
        "restart": restart,
        "version_at_kill": version_at_kill,
        "seconds": took,
        "summary": f"killed at version {version_at_kill}, resumed from {restart['resumed_from_version']}, "
        f"kept {restart.get('kept_in_actors')} sequences, trained on {took:.0f} s after the kill",
    }


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]  # whole lines only


def every_attempt(run_dir: Path, name: str) -> list[dict[str, Any]]:
    """The records of ``name`` of every attempt: the surviving lineage's and those a restart
    discarded (``discarded/attempt<n>/``)."""
    discarded = sorted(run_dir.glob(f"discarded/attempt*/{name}"))
    return [r for path in [run_dir / name, *discarded] for r in records(path)]


def last_version(run_dir: Path) -> int:
    return max((r["policy_version"] for r in records(run_dir / "metrics.jsonl")), default=0)


def role_flow_runs(state: ClusterState, run_dir: Path) -> list[dict[str, Any]]:
    """The run's ``rl-role`` flow runs (named ``<run-id>-<role><node>``), oldest first."""
    body = {"flow_runs": {"name": {"like_": f"{run_dir.name}-"}}, "sort": "EXPECTED_START_TIME_ASC"}
    return http_json(state.plan, api(state, "/flow_runs/filter"), body)


def test_the_run_launched_on_head_completes_across_the_hosts(multihost_run):
    assert multihost_run.final["state"]["type"] == "COMPLETED", multihost_run.final["state"]
    assert multihost_run.summary["final_policy_version"] == STEPS
    assert multihost_run.summary["placement"] == "pools"


def test_the_run_finishes_over_actor_links_with_latency_and_loss(multihost_run):
    """50 ms each way and 1 % loss on every actor host's link: the run above finished, and every
    update reached both actors (below). What it cost, for docs/benchmarks.md."""
    pauses = [
        r["weights/update_pause_ms"]
        for actor in (0, 1)
        for r in records(multihost_run.run_dir / f"actor{actor}.jsonl")
        if "weights/update_pause_ms" in r
    ]
    metrics = records(multihost_run.run_dir / "metrics.jsonl")
    broadcasts = [r["weights/broadcast_ms"] for r in metrics if "weights/broadcast_ms" in r]
    assert multihost_run.final["state"]["type"] == "COMPLETED" and pauses and broadcasts
    lost = records(multihost_run.run_dir / "preprocessor.jsonl")[-1]["preprocessor/lost"]
    pause, broadcast = sorted(pauses)[len(pauses) // 2], sorted(broadcasts)[len(broadcasts) // 2]
    rate = multihost_run.summary["tokens_per_s"]
    print(f"impaired actor links: pause median {pause:.1f} ms, broadcast median {broadcast:.0f} ms, ", end="")
    print(f"{rate:.0f} tokens/s, preprocessor/lost {lost}")


def test_each_stage_runs_on_its_host(multihost_run):
    placement = multihost_run.placement  # the first attempt, before its actor0's host was killed
    assert placement.get("trainer-0") == {"trainer0", "preprocessor"}, placement
    assert placement.get("trainer-1") == {"trainer1"}, placement
    actor_hosts = {host: stages for host, stages in placement.items() if host.startswith("actor-")}
    assert sorted(stage for stages in actor_hosts.values() for stage in stages) == ["actor0", "actor1"]
    assert len(actor_hosts) == 2 and all(len(s) == 1 for s in actor_hosts.values()), placement
    assert "head" not in placement and "stranger" not in placement


def test_every_weight_update_reaches_both_actors(multihost_run):
    """Every update the trainer published reached both actors, in order, once: in the first attempt
    until it ended (a killed host's actor, or the step the trainer failed in, may miss the last
    versions before the checkpoint the run resumed from: the restarted actors start from its
    weights; and an update whose digests never came, because the trainer failed right after its
    broadcast, is refused and counted, never loaded), and every update of the second attempt."""
    published = [
        r["policy_version"]
        for r in records(multihost_run.run_dir / "metrics.jsonl")
        if "weights/broadcast_ms" in r
    ]
    assert published == list(range(1, STEPS + 1)), "the trainer published every version once"
    restarts = records(multihost_run.run_dir / "restarts.jsonl")
    resumed = restarts[-1]["resumed_from_version"]  # every stage restarted there
    rebased = [r["resumed_from_version"] for r in restarts if not r["actors_restarted"]]
    for actor in (0, 1):
        actor_records = records(multihost_run.run_dir / f"actor{actor}.jsonl")
        loaded = [r["policy_version"] for r in actor_records if "weights/update_pause_ms" in r]
        refused = max((r.get("actor/weight_buckets_refused", 0) for r in actor_records), default=0)
        first, second = [v for v in loaded if v <= resumed], [v for v in loaded if v > resumed]
        for version in rebased:  # an actor that outlived the trainer role's restart loads its checkpoint's
            if first.count(version) == 2:  # weights again (it had loaded them before)
                first.remove(version)
        print(
            f"actor{actor}: loaded {first} before the restart (resumed from {resumed}), {refused} bucket(s) "
            "refused"
        )
        assert second == [v for v in published if v > resumed], f"actor{actor} loaded {loaded}"
        # In order, once each; at most the versions of the last checkpoint interval
        # (trainer.checkpoint_every=2) missed, or one skipped for each update it refused.
        assert first == sorted(set(first)) and set(first) <= set(published[:resumed]), loaded
        skipped = [v for v in published if v < max(first, default=0) and v not in first]
        assert len(skipped) <= refused, f"actor{actor} loaded {loaded}, skipped {skipped}, refused {refused}"
        assert len(first) + len(skipped) >= resumed - 2, f"actor{actor} loaded {loaded}"


def test_the_ledger_on_head_holds_every_trained_rollout_once(cluster, multihost_run):
    from pipelinerl.platform.tracking.store import PlatformStore  # noqa: PLC0415

    trained = [
        rollout_id
        for r in records(multihost_run.run_dir / "metrics.jsonl")
        for rollout_id, _ in r["rollouts"]
    ]
    assert len(trained) == len(set(trained)) == multihost_run.summary["samples_trained"]
    url = cluster.plan.database_url.replace("@head:", f"@{cluster.plan.host('head').address}:")

    def ledger() -> set[str]:
        with PlatformStore(url) as store:
            return store.consumed_ids(multihost_run.run_dir.name)

    assert host_call(cluster.plan, "head", ledger) == set(trained)


def test_the_heads_dashboard_and_mlflow_showed_the_run_live(multihost_run):
    assert multihost_run.dashboard_live is not None, "the dashboard listed the run while it ran"
    assert multihost_run.dashboard_live["status"] == "running", multihost_run.dashboard_live
    assert multihost_run.mlflow_live is not None and multihost_run.mlflow_live["info"]["status"] == "RUNNING"


def test_the_run_publishes_its_progress_and_mlflow_link_as_artifacts(cluster, multihost_run):
    body = {"artifacts": {"flow_run_id": {"any_": [multihost_run.flow_run_id]}}}
    artifacts = http_json(cluster.plan, api(cluster, "/artifacts/filter"), body)
    by_key = {artifact["key"]: artifact for artifact in artifacts}
    assert by_key["rl-run-progress"]["type"] == "table", sorted(by_key)
    assert "MLflow run" in by_key["rl-run-mlflow"]["data"]


def test_a_stranger_on_the_cluster_network_gets_nothing_in_and_nothing_out(multihost_run):
    stranger = multihost_run.stranger
    for socket in ("rollouts", "batch_inbox_push", "notices", "batch_inbox_pull"):
        assert stranger[socket]["handshake"] == "refused", stranger
    assert stranger["notices"]["received"] == 0 and stranger["batch_inbox_pull"]["received"] == 0
    # The stranger came in the first attempt: its stages' counts are in its records, those after the
    # version the run resumed from among the discarded ones (the second attempt counts from zero).
    preprocessor = every_attempt(multihost_run.run_dir, "preprocessor.jsonl")
    refused = max(r["preprocessor/unauthenticated"] for r in preprocessor)
    assert refused >= 2, "the preprocessor refused the stranger on the rollouts and the inbox"
    assert all(r["preprocessor/malformed"] == 0 for r in preprocessor)
    trainer = every_attempt(multihost_run.run_dir, "metrics.jsonl")
    assert max(r["trainer/unauthenticated"] for r in trainer) >= 1, "the notices publisher refused it"


def test_each_node_is_a_subflow_that_streams_its_own_stages(cluster, multihost_run):
    roles = {r["name"].rsplit("-", 1)[1]: r for r in role_flow_runs(cluster, multihost_run.run_dir)}
    assert all(r["parent_task_run_id"] is not None for r in roles.values()), "linked to the rl-run"
    body = {"logs": {"flow_run_id": {"any_": [roles["actor1"]["id"]]}}, "limit": 200}
    messages = [log["message"] for log in http_json(cluster.plan, api(cluster, "/logs/filter"), body)]
    assert any(m.startswith("[actor1]") for m in messages), "actor1's flow run has its stage's logs"
    assert not any(m.startswith("[actor0]") for m in messages), "and not those of the other node"
    assert any("on host actor-" in m for m in messages), "and says which host it runs on"


def test_the_run_and_its_flow_runs_outlive_a_prefect_server_restart(cluster, multihost_run):
    away, version = multihost_run.prefect_away_s, multihost_run.version_at_prefect_restart
    print(f"Prefect API away {away:.1f} s from version {version}")
    assert version < multihost_run.versions_around_cut[2], "the first attempt trained on after the restart"
    after = multihost_run.roles_after_prefect_restart
    assert sorted(r["name"].rsplit("-", 1)[1] for r in after) == ["actor0", "actor1", "trainer0", "trainer1"]
    assert all(r["state"]["type"] == "RUNNING" for r in after), [(r["name"], r["state"]) for r in after]
    assert multihost_run.final["state"]["type"] == "COMPLETED"
    newest = {r["name"]: r for r in role_flow_runs(cluster, multihost_run.run_dir)}  # oldest first
    assert all(r["state"]["type"] == "COMPLETED" for r in newest.values()), [
        (r["name"], r["state"]) for r in newest.values()
    ]


# ----- faults between hosts (the same run, after the above) -----


def test_a_link_down_for_15_s_holds_the_run_back_and_it_goes_on(multihost_run):
    at_cut, at_restore, going_on = multihost_run.versions_around_cut
    print(f"link of {multihost_run.cut_host} down at version {at_cut}, up at {at_restore}, then {going_on}")
    # While actor1's host was away the trainer's broadcast waited for it (every actor receives every
    # update), so at most the step in progress completed; afterwards the run trained on.
    assert at_restore <= at_cut + 1 and going_on >= at_restore + 2


def test_a_killed_trainer_rank_restarts_the_trainer_role_alone(cluster, multihost_run):
    """Trainer rank 1 killed on trainer-1: the launcher stops the trainer role's flow runs and submits
    them again from the newest checkpoint; the actors' flow runs and processes are the same before and
    after (they paused, kept their engines and took the checkpoint's weights across the link)."""
    trainer = multihost_run.trainer_restart
    print("trainer role restart:", trainer["summary"])
    restart = trainer["restart"]
    assert restart["actors_restarted"] is False, restart
    assert "trainer" in restart["reason"], restart["reason"]
    assert restart["resumed_from_version"] >= trainer["version_at_kill"] - 2, restart
    before, after = trainer["before"], trainer["after"]
    assert set(before["flow_runs"]) == {"actor0", "actor1"}, before
    assert after["flow_runs"] == before["flow_runs"], "the actors' flow runs are the same ones, running"
    assert all(state == "RUNNING" for _, state in after["flow_runs"].values()), after
    assert {k: after["pids"].get(k) for k in ("actor0", "actor1")} == {
        k: before["pids"][k] for k in ("actor0", "actor1")
    }, "the actors' processes are the same ones"
    assert after["pids"]["trainer1"] != before["pids"]["trainer1"], "trainer rank 1 runs again"
    assert after["pids"]["trainer0"] != before["pids"]["trainer0"], "the whole role restarted"
    names = [r["name"].rsplit("-", 1)[1] for r in role_flow_runs(cluster, multihost_run.run_dir)]
    # The first attempt's two of each role, the trainer role's again, then every role on the spare.
    assert sorted(names) == sorted(["actor0", "actor1"] * 2 + ["trainer0", "trainer1"] * 3), names


def test_no_prompt_is_skipped_or_trained_twice_across_the_faults(multihost_run):
    """``pipelinerl runs audit`` over the three attempts (the trainer role's restart with actors that
    outlived it, then every role's onto the spare host)."""
    audit = audit_run(multihost_run.run_dir, ranks=2)
    for actor in audit.actors:
        print("prompt audit:", actor)
        assert actor.skipped == [] and actor.trained_twice == [], actor
    # 16 sequences a step in groups of 4; some groups dropped for equal rewards
    assert sum(actor.trained_once for actor in audit.actors) >= STEPS * 16 // 4 // 2


def test_a_host_that_disappears_is_replaced_by_the_spare(cluster, multihost_run):
    killed, after_s = multihost_run.killed_host, multihost_run.noticed_after_s
    print(f"{killed} killed; the actors ran again on the other hosts {after_s:.0f} s later")
    assert multihost_run.final["state"]["type"] == "COMPLETED", multihost_run.final["state"]
    assert multihost_run.summary["restarts"] == 2
    assert multihost_run.summary["final_policy_version"] == STEPS
    actor_hosts = set(ACTOR_HOSTS)
    first = {h for h in multihost_run.placement if h in actor_hosts}
    second = {h for h in multihost_run.after if h in actor_hosts}
    spare = actor_hosts - first
    assert len(first) == 2 and len(spare) == 1
    assert second == (first - {killed}) | spare, (multihost_run.placement, multihost_run.after)
    # No flow run of the first attempt is left running; the lost host is named, both in the flow run
    # that ran there (crashed) and in why the attempt ended, even where the trainer's broadcast to it
    # failed first (the killed processes' sockets reset at once): the launcher then waits for the
    # late heartbeat to lapse (role_heartbeat.attribution). The same reason ends a run without restarts.
    roles = role_flow_runs(cluster, multihost_run.run_dir)
    described = [(r["name"], r["state"]["type"], r["state"]["message"]) for r in roles]
    for name, state, message in described:  # in full: pytest cuts a long assertion message
        print(f"role flow run {name}: {state}: {message}")
    assert all(r["state"]["type"] not in ("RUNNING", "PENDING", "SCHEDULED", "CANCELLING") for r in roles), (
        described
    )
    # The flow runs the launcher marked lost (``placement._mark_lost``: crashed, "host <name> lost: ..."),
    # not any whose message has the word (a failed stage's message carries its log's last lines).
    lost = [r for r in roles if re.match(r"host \S+ lost: ", r["state"]["message"] or "")]
    assert lost and all(r["state"]["type"] == "CRASHED" for r in lost), described
    # Only the killed host: a healthy role whose stages stopped with the failed attempt said so in its
    # last heartbeat (``ended``), so its silence while its flow run reports its end is not a lost host.
    wrongly = [r["name"] for r in lost if not r["state"]["message"].startswith(f"host {killed} lost: ")]
    assert wrongly == [], described
    assert any(r["state"]["message"].startswith(f"host {killed} lost: ") for r in lost), described
    discarded = records(multihost_run.run_dir / "restarts.jsonl")[-1]
    print("the second attempt ended:", discarded["reason"][:400])
    assert f"host {killed} lost" in discarded["reason"], discarded["reason"]


def test_nothing_is_trained_twice_across_the_faults(multihost_run):
    metrics = records(multihost_run.run_dir / "metrics.jsonl")
    versions = [r["policy_version"] for r in metrics]
    assert versions == list(range(1, STEPS + 1)), "the run directory holds the surviving lineage"
    kept = [rollout_id for r in metrics for rollout_id, _ in r["rollouts"]]
    assert kept and len(kept) == len(set(kept)), "no rollout trained twice in the surviving lineage"
    preprocessor = records(multihost_run.run_dir / "preprocessor.jsonl")
    print("preprocessor/lost", preprocessor[-1]["preprocessor/lost"] if preprocessor else None)


# ----- the harness itself -----


def test_an_impaired_link_delays_and_drops_frames(tmp_path):
    """The relay on a host's cable (``flows/netns_relay.py``; this kernel has no ``netem``): a TCP
    connection's handshake takes the round trip, and a transfer completes through the drops."""
    if why := cannot_make_namespaces():
        pytest.skip(f"network namespaces: {why}")
    prefix = f"{PREFIX}r"
    netns_cluster.down(prefix=prefix)
    plan = plan_cluster(tmp_path, prefix, [("head", "head"), ("actor-0", "actors")])
    state = ClusterState(plan=plan)
    try:
        netns_cluster.make_network(plan)
        impair_link(state, "actor-0", delay_ms=50, loss=0.01, seed=0)

        def transfer(port: int) -> tuple[float, int]:
            """head sends 2 MB to actor-0 over TCP: the handshake's milliseconds, the bytes received."""
            receiver = (
                f"import socket; s = socket.create_server(('actor-0', {port})); c, _ = s.accept(); n = 0\n"
                "while (d := c.recv(1 << 20)): n += len(d)\n"
                "print(n)"
            )
            listening = subprocess.Popen(
                ["ip", "netns", "exec", plan.host("actor-0").namespace, sys.executable, "-c", receiver],
                stdout=subprocess.PIPE,
                text=True,
            )
            sender = (
                "import socket, time\n"
                "for _ in range(100):\n"
                "    started = time.monotonic()\n"
                f"    try: s = socket.create_connection(('actor-0', {port})); break\n"
                "    except OSError: time.sleep(0.1)\n"
                "print(round(1000 * (time.monotonic() - started), 1)); s.sendall(b'x' * 2_000_000); s.close()"
            )
            sent = run_on(state, "head", [sys.executable, "-c", sender], timeout_s=120)
            assert sent.returncode == 0, sent.stderr
            received, _ = listening.communicate(timeout=120)
            return float(sent.stdout.split()[-1]), int(received)

        handshake_ms, received = transfer(9000)
        print(f"handshake {handshake_ms} ms through the relay")
        assert handshake_ms >= 95, "a round trip of 2 x 50 ms"
        assert received == 2_000_000, "TCP delivered everything through 1 % loss"
        # The cable cut and restored with the relay on it (a fault the multi-host run injects): the
        # relay forwards both ways again.
        set_link(state, "actor-0", up=False)
        time.sleep(1.0)
        set_link(state, "actor-0", up=True)
        assert transfer(9001)[1] == 2_000_000, "the relay forwards again after the cable came back"
        relay_log = (tmp_path / "cluster" / "logs" / "relay-actor-0.log").read_text()
        assert "50 ms each way, 1.00% loss" in relay_log
    finally:
        netns_cluster.down(prefix=prefix)
    assert netns_cluster.namespaces_with_prefix(prefix) == []


def test_down_removes_what_an_interrupted_cluster_left(tmp_path):
    """Namespaces, links, hosts files and a process, as a test killed midway leaves them: ``down``
    with the prefix alone removes all of it."""
    if why := cannot_make_namespaces():
        pytest.skip(f"network namespaces: {why}")
    prefix = f"{PREFIX}x"
    netns_cluster.down(prefix=prefix)
    plan = plan_cluster(tmp_path, prefix, [("head", "head"), ("actor-0", "actors")])
    netns_cluster.make_network(plan)
    sleeper = subprocess.Popen(["ip", "netns", "exec", plan.host("actor-0").namespace, "sleep", "600"])
    try:
        wait_until(lambda: namespace_pids(plan.host("actor-0").namespace), 30, "the sleeper to start")
        assert set(netns_cluster.namespaces_with_prefix(prefix)) == set(plan.namespaces)
        removed = netns_cluster.down(prefix=prefix)
        assert set(removed) == set(plan.namespaces)
        assert sleeper.wait(timeout=30) != 0, "the host's process was killed"
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
    assert netns_cluster.namespaces_with_prefix(prefix) == []
    assert not any((Path("/etc/netns") / ns).exists() for ns in plan.namespaces)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert "v-actor-0" not in links and "v-head" not in links, "nothing was added to the machine's namespace"
