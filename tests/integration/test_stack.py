"""The local stack (``pipelinerl up`` / ``down``): real Prefect and MLflow servers, process workers,
the registered deployments, a run submitted through the Prefect API, and its cancellation.

One stack is started for the module in a temporary home on free ports (below the ephemeral range);
the tests run in order and the last one stops it.
"""

from __future__ import annotations

import json
import random
import socket
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import psutil
import pytest

from pipelinerl.flows.stack import StackError, down, group_members, read_state, state_path, up
from pipelinerl.platform.config import load_config
from tests.conftest import worker_port

pytestmark = pytest.mark.slow

T = TypeVar("T")
RUN_TIMEOUT_S = 300.0


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(low: int, high: int, count: int = 1, taken: set[int] | None = None) -> int:
    """The first of ``count`` consecutive free ports in [low, high) (below the ephemeral range)."""
    taken = taken or set()
    candidates = list(range(low, high - count))
    random.shuffle(candidates)
    for first in candidates:
        block = range(first, first + count)
        if not taken.intersection(block) and all(port_is_free(p) for p in block):
            taken.update(block)
            return first
    raise RuntimeError(f"no {count} consecutive free ports in {low}-{high}")


_TAKEN: set[int] = set()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    home = tmp_path_factory.mktemp("stack-home")
    prefect_port = free_ports(worker_port(23000), worker_port(24000), taken=_TAKEN)
    mlflow_port = free_ports(worker_port(23000), worker_port(24000), taken=_TAKEN)
    ui_port = free_ports(worker_port(23000), worker_port(24000), taken=_TAKEN)
    started = time.monotonic()
    state = up(home, prefect_port, mlflow_port, ui_port=ui_port)
    print(f"stack up in {time.monotonic() - started:.1f} s")
    yield state
    if state_path(state.home).exists():  # a test failed before test_down_stops_everything
        down(state.home)


def prefect(state, work: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``work(client)`` with a Prefect client of the stack's API."""
    from prefect.client.orchestration import PrefectClient

    async def main() -> T:
        async with PrefectClient(state.prefect_api_url) as client:
            return await work(client)

    return anyio.run(main)


def small_config(random_model_dir: Path, tmp_path: Path, max_steps: int) -> dict[str, Any]:
    base_port = free_ports(worker_port(24000), worker_port(25000), count=8, taken=_TAKEN)
    config = load_config(
        None,
        [
            f"model.path={random_model_dir}",
            f"run.output_dir={tmp_path / 'runs'}",
            f"run.home={tmp_path / 'home'}",
            "run.name=stack-test",
            f"run.max_steps={max_steps}",
            "rl.batch_size=16",
            "actor.max_in_flight=16",
            "task.eval_problems=16",
            "tracking.flush_interval_s=0.5",
            f"transport.base_port={base_port}",
        ],
    )
    return config.model_dump(mode="json")


def role_flow_runs(state, run_dir: Path) -> list:
    """The ``rl-role`` flow runs of a run placed on the pools (named ``<run-id>-<role><node>``)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    async def work(client):
        return await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=f"{run_dir.name}-"))
        )

    return sorted(prefect(state, work), key=lambda run: run.created)


def submit(state, parameters: dict[str, Any]) -> str:
    from prefect.deployments import run_deployment

    async def work(client):
        flow_run = await run_deployment(
            "rl-run/default", client=client, parameters=parameters, timeout=0, as_subflow=False
        )
        return str(flow_run.id)

    return prefect(state, work)


def read_flow_run(state, flow_run_id: str):
    return prefect(state, lambda client: client.read_flow_run(flow_run_id))


def wait_for_final_state(state, flow_run_id: str, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while True:
        flow_run = read_flow_run(state, flow_run_id)
        if flow_run.state is not None and flow_run.state.is_final():
            return flow_run
        if time.monotonic() > deadline:
            pytest.fail(
                f"flow run {flow_run_id} still {flow_run.state_name} after {timeout_s:.0f} s; worker log:\n"
                + worker_log(state)
            )
        time.sleep(2)


def worker_log(state) -> str:
    log = state.home / "stack" / "logs" / f"worker-{state.launch_pool}.log"
    return "\n".join(log.read_text(errors="replace").splitlines()[-60:]) if log.exists() else "(no log)"


def flow_run_logs(state, flow_run_id: str, lines: int = 40) -> str:
    """The flow run's last log lines in Prefect (its own and its stages'), for failure messages."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async def work(client):
        return await client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200
        )

    logs = prefect(state, work)
    return "\n".join(f"{log.timestamp:%H:%M:%S.%f} {log.name}: {log.message}" for log in logs[-lines:])


def mlflow_runs_of(state, flow_run_id: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=state.mlflow_url)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments, filter_string=f"tags.prefect_flow_run_id = '{flow_run_id}'")


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmdline = " ".join(process.info["cmdline"] or [])
        except psutil.Error:
            continue
        if text in cmdline and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append((process.info["pid"], cmdline[:200]))
    return found


def test_up_serves_prefect_mlflow_and_the_deployments(stack):
    with urllib.request.urlopen(f"{stack.prefect_api_url}/health", timeout=10) as response:
        assert json.loads(response.read()) is True
    with urllib.request.urlopen(f"{stack.mlflow_url}/health", timeout=10) as response:
        assert response.read().decode().strip() == "OK"
    # The UI's first page can take minutes on a loaded 2-core machine (CI runs two test workers).
    with urllib.request.urlopen(stack.prefect_ui_url, timeout=150) as response:
        assert response.status == 200, "the Prefect UI is served"
    saved = read_state(stack.home)
    assert saved is not None and saved.ready
    assert {p.name for p in saved.processes} == {
        "prefect-server",
        "mlflow-server",
        "worker-actors",
        "worker-trainers",
        "worker-local",
        "dashboard",
    }
    with urllib.request.urlopen(f"{stack.dashboard_url}/api/runs", timeout=30) as response:
        assert response.status == 200 and isinstance(json.loads(response.read()), (list, dict))
    assert saved.mlflow_store_uri == f"sqlite:///{stack.home / 'mlflow.db'}"
    assert (stack.home / "mlflow.db").exists()

    async def read(client):
        deployments = {
            name: await client.read_deployment_by_name(name)
            for name in (
                "rl-run/default",
                "compare/default",
                "sweep/default",
                "rl-role/trainers",
                "rl-role/actors",
            )
        }
        pools = {name: await client.read_work_pool(name) for name in ("actors", "trainers", "local")}
        workers = {name: await client.read_workers_for_work_pool(name) for name in pools}
        return deployments, pools, workers

    deployments, pools, workers = prefect(stack, read)
    assert {name: str(d.id) for name, d in deployments.items()} == stack.deployments
    pool_of = {name: d.work_pool_name for name, d in deployments.items()}
    assert pool_of == {
        "rl-run/default": "local",
        "compare/default": "local",
        "sweep/default": "local",
        "rl-role/trainers": "trainers",
        "rl-role/actors": "actors",
    }
    assert deployments["rl-run/default"].entrypoint == "pipelinerl/flows/rl_run.py:rl_run"
    assert "config" in deployments["rl-run/default"].parameter_openapi_schema["properties"]
    assert all(pool.type == "process" for pool in pools.values())
    assert all(any(w.status == "ONLINE" for w in found) for found in workers.values()), workers
    assert not deployments["rl-run/default"].schedules
    (schedule,) = deployments["sweep/default"].schedules
    assert schedule.active is False, "the nightly sweep is created disabled"
    assert schedule.schedule.cron == "0 3 * * *"
    assert schedule.parameters["grid"] == {"actor.max_in_flight": [16, 32, 64]}


def test_a_second_up_refuses(stack):
    with pytest.raises(StackError, match="already running"):
        up(stack.home, stack.prefect_port + 1, stack.mlflow_port + 1)
    assert read_state(stack.home) == stack, "the running stack's state is untouched"


def test_a_taken_port_fails_at_once_naming_it(tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(StackError, match=f"port {port} .*Prefect server.*--prefect-port"):
            up(tmp_path, port, free_ports(worker_port(23000), worker_port(24000), taken=_TAKEN))
        assert time.monotonic() - started < 5
    assert not state_path(tmp_path).exists()


def test_rl_run_deployment_on_the_pools_completes_and_tracks_to_the_stack(stack, random_model_dir, tmp_path):
    """rl-run submitted through the Prefect client; it places each role node as an rl-role flow run.
    (The same deployment with the default local placement runs in the cancellation test.)"""
    config = small_config(random_model_dir, tmp_path, max_steps=3)
    config["cluster"].update(placement="pools", actor_nodes=2)
    config["actor"].update(num_actors=2, max_in_flight=8)
    flow_run_id = submit(stack, {"config": config})
    flow_run = wait_for_final_state(stack, flow_run_id, RUN_TIMEOUT_S)
    assert flow_run.state.is_completed(), f"{flow_run.state}\n{flow_run_logs(stack, flow_run_id)}"
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["placement"] == "pools"

    roles = role_flow_runs(stack, run_dir)
    assert sorted(run.name for run in roles) == sorted(
        f"{run_dir.name}-{name}" for name in ("trainer0", "actor0", "actor1")
    )
    assert all(run.state.is_completed() for run in roles), [(run.name, run.state) for run in roles]
    deployment_of = {str(d_id): name for name, d_id in stack.deployments.items()}
    assert {run.name.rsplit("-", 1)[1]: deployment_of[str(run.deployment_id)] for run in roles} == {
        "trainer0": "rl-role/trainers",
        "actor0": "rl-role/actors",
        "actor1": "rl-role/actors",
    }
    assert all(run.parent_task_run_id is not None for run in roles), "linked to the rl-run as subflows"
    actor1 = next(run for run in roles if run.name.endswith("actor1"))
    actor1_logs = flow_run_logs(stack, str(actor1.id), lines=400)
    assert "[actor1]" in actor1_logs and "[actor0]" not in actor1_logs, "each node streams its own stages"
    # Both actors generated: each wrote its own records in the shared run directory.
    assert all((run_dir / f"actor{k}.jsonl").stat().st_size > 0 for k in (0, 1))
    (mlflow_run,) = mlflow_runs_of(stack, flow_run_id)
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.info.run_id == (run_dir / "mlflow_run_id").read_text()
    assert mlflow_run.data.params["run.max_steps"] == "3"
    assert mlflow_run.data.params["cluster.placement"] == "pools"
    assert not processes_mentioning(str(run_dir))


def test_a_crashed_role_on_the_pools_restarts_from_its_checkpoint(stack, random_model_dir, tmp_path):
    import os
    import signal

    config = small_config(random_model_dir, tmp_path, max_steps=6)
    config["cluster"].update(placement="pools")
    config["run"].update(max_restarts=1)
    config["trainer"].update(checkpoint_every=2)
    flow_run_id = submit(stack, {"config": config})
    deadline = time.monotonic() + RUN_TIMEOUT_S
    runs = tmp_path / "runs"
    killed = None
    while killed is None:
        assert time.monotonic() < deadline, "training never reached version 3"
        metrics = list(runs.glob("*/metrics.jsonl"))
        if metrics and any(
            json.loads(line)["policy_version"] >= 3 for line in metrics[0].read_text().splitlines()
        ):
            (run_dir,) = runs.iterdir()
            for pid, cmdline in processes_mentioning(str(run_dir)):
                if "--actor-id 0" in cmdline:
                    os.kill(pid, signal.SIGKILL)
                    killed = pid
        time.sleep(0.2)
    flow_run = wait_for_final_state(stack, flow_run_id, RUN_TIMEOUT_S)
    assert flow_run.state.is_completed(), f"{flow_run.state}\n{flow_run_logs(stack, flow_run_id)}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == 1 and summary["final_policy_version"] == 6

    roles = role_flow_runs(stack, run_dir)
    assert len(roles) == 4, [(run.name, run.state_name) for run in roles]
    first_actor, second_actor = (run for run in roles if run.name.endswith("actor0"))
    assert first_actor.state.is_failed()
    assert "stage actor0 exited with code -9" in first_actor.state.message
    assert second_actor.state.is_completed()
    first_trainer, second_trainer = (run for run in roles if run.name.endswith("trainer0"))
    assert first_trainer.state.is_cancelled(), "the rest of the first attempt was cancelled"
    assert second_trainer.state.is_completed()
    logs = flow_run_logs(stack, flow_run_id, lines=200)
    assert "restart 1 of 1 from the checkpoint" in logs
    assert not processes_mentioning(str(run_dir))


def test_cancelling_a_flow_run_stops_every_stage(stack, random_model_dir, tmp_path):
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelling

    flow_run_id = submit(stack, {"config": small_config(random_model_dir, tmp_path, max_steps=200)})
    deadline = time.monotonic() + RUN_TIMEOUT_S
    runs = tmp_path / "runs"
    while not (runs.is_dir() and any(runs.glob("*/metrics.jsonl"))):
        flow_run = read_flow_run(stack, flow_run_id)
        assert not flow_run.state.is_final(), f"{flow_run.state}\n{worker_log(stack)}"
        assert time.monotonic() < deadline, "the run never started training"
        time.sleep(1)
    (run_dir,) = runs.iterdir()
    assert processes_mentioning(str(run_dir)), "the stages run"

    result = prefect(
        stack,
        lambda client: client.set_flow_run_state(flow_run_id, Cancelling(message="cancelled by the test")),
    )
    assert result.status.value == "ACCEPT", result
    cancelled_at = time.monotonic()
    flow_run = wait_for_final_state(stack, flow_run_id, 120)
    print(f"flow run {flow_run.state_name} {time.monotonic() - cancelled_at:.1f} s after the cancel")
    assert flow_run.state.type == StateType.CANCELLED, f"{flow_run.state}\n{worker_log(stack)}"

    deadline = time.monotonic() + 60
    while processes_mentioning(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not processes_mentioning(str(run_dir)), "a stage outlived the cancelled flow run"
    print(f"no stage left {time.monotonic() - cancelled_at:.1f} s after the cancel")

    deadline = time.monotonic() + 60
    while True:
        (mlflow_run,) = mlflow_runs_of(stack, flow_run_id)
        if mlflow_run.info.status != "RUNNING" or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert mlflow_run.info.status == "KILLED", (
        f"{mlflow_run.info}\nflow run logs:\n{flow_run_logs(stack, flow_run_id)}\n"
        f"worker log:\n{worker_log(stack)}"
    )


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed child of this test process stays a zombie until reaped)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_down_stops_everything(stack):
    saved = read_state(stack.home)
    assert saved is not None
    started = time.monotonic()
    stopped = down(stack.home)
    print(f"stack down in {time.monotonic() - started:.1f} s")
    assert stopped is not None
    assert not state_path(stack.home).exists()
    for proc in saved.processes:
        assert not running(proc.pid), f"{proc.name} (pid {proc.pid}) is still there"
        assert group_members(proc.pgid) == [], f"{proc.name}'s process group still has members"
    assert port_is_free(stack.prefect_port) and port_is_free(stack.mlflow_port)
    assert down(stack.home) is None, "a second down finds nothing to stop"
