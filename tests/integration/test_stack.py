"""The local stack (``pipelinerl up`` / ``down``): real Prefect and MLflow servers, process workers,
the registered deployments, Prefect's run form in a real browser, and a run submitted through the
Prefect API.

One stack is started for the module in a temporary home on free ports (below the ephemeral range);
the tests run in order and the last one stops it. Its Prefect server keeps its state in a fresh
PostgreSQL database (SQLite answered "database is locked" to the form on a loaded machine). The run,
with the default local placement, is cancelled once it trains: its stages' logs and MLflow
link reached Prefect while it ran, and the cancel stops every stage. Runs placed on the pools (over
several hosts, with their crashes and restarts) are tests/integration/test_multihost.py's.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import psutil
import pytest
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    DeploymentFilter,
    DeploymentFilterId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import StateType
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.states import Cancelling
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from pipelinerl.flows.rl_run import rl_run
from pipelinerl.flows.stack import StackError, down, group_members, read_state, state_path, up
from pipelinerl.platform.config import load_config
from pipelinerl.platform.tracking.store import PlatformStore
from tests.browser import headless_chromium, screenshot_dir
from tests.conftest import fresh_postgres_database, wait_until, worker_port

# The module's runs share one stack: its first tests wait for runs that take minutes on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

T = TypeVar("T")
RUN_TIMEOUT_S = 600.0  # a bound on a hang: a run takes 1-3 minutes, several on a loaded 2-core machine
WORKER_QUERY_S = "2"  # how often the stack's workers look for flow runs (Prefect's default: every 10 s)
REPOSITORY = Path(__file__).resolve().parents[2]
PAGE_TIMEOUT_S = 120  # the form renders the whole config schema; slow on a loaded 2-core machine


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
    # The dashboard reads the platform database read-only and answers /api/runs with a 503 while the
    # database does not exist; a run's tracker creates it. test_up asks before any run of this module
    # (an earlier module of the same test worker may or may not have made it): create it as a first
    # run would.
    with PlatformStore(os.environ["PIPELINERL_DATABASE_URL"]):
        pass
    started = time.monotonic()
    # The stack's processes take their environment from this one: its workers poll for flow runs more
    # often than by default, so the runs' hand-offs between pools wait less (what they do is the same).
    # Its Prefect server keeps its state in PostgreSQL, as docs/cluster.md has it on a cluster.
    with fresh_postgres_database() as database:
        prefect_database = database.replace("postgresql://", "postgresql+asyncpg://", 1)
        settings = {
            "PREFECT_WORKER_QUERY_SECONDS": WORKER_QUERY_S,
            "PREFECT_API_DATABASE_CONNECTION_URL": prefect_database,
        }
        before = {name: os.environ.get(name) for name in settings}
        os.environ.update(settings)
        try:
            state = up(home, prefect_port, mlflow_port, ui_port=ui_port)
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        print(f"stack up in {time.monotonic() - started:.1f} s")
        yield state
        if state_path(state.home).exists():  # a test failed before test_down_stops_everything
            down(state.home)


def prefect(state, work: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``work(client)`` with a Prefect client of the stack's API."""

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


def submit(state, parameters: dict[str, Any], deployment: str = "rl-run/default") -> str:
    async def work(client):
        flow_run = await run_deployment(
            deployment, client=client, parameters=parameters, timeout=0, as_subflow=False
        )
        return str(flow_run.id)

    return prefect(state, work)


def read_flow_run(state, flow_run_id: str):
    return prefect(state, lambda client: client.read_flow_run(flow_run_id))


def wait_for_final_state(state, flow_run_id: str, timeout_s: float):
    def final():
        flow_run = read_flow_run(state, flow_run_id)
        return flow_run if flow_run.state is not None and flow_run.state.is_final() else None

    try:
        return wait_until(final, timeout_s, f"flow run {flow_run_id} to end", interval_s=1.0)
    except pytest.fail.Exception:
        pytest.fail(
            f"flow run {flow_run_id} still {read_flow_run(state, flow_run_id).state_name} after "
            f"{timeout_s:.0f} s; worker log:\n{worker_log(state)}"
        )


def settled(condition: Callable[[], T | None], timeout_s: float, what: str) -> T | None:
    """``wait_until``, for a fixture that records what it saw: after ``timeout_s`` it returns None, and
    the test of that property fails (the fixture's other observations still reach their tests)."""
    try:
        return wait_until(condition, timeout_s, what, interval_s=0.5)
    except pytest.fail.Exception:
        return None


def worker_log(state) -> str:
    log = state.home / "stack" / "logs" / f"worker-{state.launch_pool}.log"
    return "\n".join(log.read_text(errors="replace").splitlines()[-60:]) if log.exists() else "(no log)"


def flow_run_log_records(state, flow_run_id: str) -> list:
    """Every log record of the flow run in Prefect (its own and its stages'), oldest first."""
    page = 200

    async def work(client):
        records: list = []
        while True:
            batch = await client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                limit=page,
                offset=len(records),
            )
            records.extend(batch)
            if len(batch) < page:
                return records

    return prefect(state, work)


def flow_run_messages(state, flow_run_id: str) -> list[str]:
    return [log.message for log in flow_run_log_records(state, flow_run_id)]


def flow_run_logs(state, flow_run_id: str, lines: int = 40) -> str:
    """The flow run's last log lines in Prefect, for failure messages."""
    logs = flow_run_log_records(state, flow_run_id)
    return "\n".join(f"{log.timestamp:%H:%M:%S.%f} {log.name}: {log.message}" for log in logs[-lines:])


def artifacts_of(state, flow_run_id: str) -> dict[str, Any]:
    """The flow run's Prefect artifacts by key (the latest of each)."""

    async def work(client):
        return await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )

    return {artifact.key: artifact for artifact in sorted(prefect(state, work), key=lambda a: a.created)}


def mlflow_runs_of(state, flow_run_id: str) -> list:
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
                "plan/default",
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
        "plan/default": "local",
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


def test_doctor_finds_the_local_stack_without_prefect_api_url(stack):
    """A user who ran `pipelinerl up` and set nothing: the doctor checks that stack's Prefect API, its
    pools and their workers, and its MLflow server, as a run in that home would use them (its services
    alone, `--only services`: the whole doctor is test_doctor.py's)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "CUDA_VISIBLE_DEVICES")
    }
    argv = [sys.executable, "-m", "pipelinerl.cli", "doctor", "--json", "--only", "services"]
    argv += ["--set", f"run.home={stack.home}"]
    argv += ["--set", f"transport.base_port={worker_port(23460)}"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    checks = {check["name"]: check for check in json.loads(done.stdout)["checks"]}
    prefect_api = checks["Prefect API"]
    assert prefect_api["status"] == "PASS", prefect_api
    assert stack.prefect_api_url in prefect_api["detail"] and "local stack" in prefect_api["detail"]
    for role, pool in (("trainer", "trainers"), ("actor", "actors")):
        found = checks[f"pool of {role}s"]
        assert found["status"] == "PASS" and found["data"]["pool"] == pool, found
        assert found["data"]["online"], found
    tracking = checks["tracking store (MLflow)"]
    assert tracking["status"] == "PASS" and stack.mlflow_url in tracking["detail"], tracking


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


# ----- Prefect's run form, in a real headless browser -----
# A cross-field mistake is shown under the field to change, in words, and no flow run is created; a
# good change is submitted. The rules come from the flow's parameter schema
# (``config/base.requires_when``, ``multiple_of_field``), which Prefect's form validates on submit.
# Screenshots go to ``$PIPELINERL_TEST_ARTIFACTS/prefect-form`` (default ``.cache/test-artifacts``).
# These run before the module's runs are submitted: with a run training beside it, the loaded server
# once took over a minute to create the good form's flow run.


@pytest.fixture(scope="module")
def form_deployment_id(stack) -> str:
    """rl-run deployed as ``rl-run/form-check`` on no work pool: its flow runs are created, never run."""
    with temporary_settings(updates={PREFECT_API_URL: stack.prefect_api_url}):
        return str(rl_run.to_deployment(name="form-check").apply())


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with headless_chromium(window="1400,2400") as session:
        yield session


@pytest.fixture(scope="module")
def artifacts() -> Path:
    return screenshot_dir("prefect-form")


def form_flow_runs(state, deployment_id: str) -> list[Any]:
    return prefect(
        state,
        lambda client: client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
        ),
    )


def form_field(browser: Any, label: str, description: str) -> Any:
    """The form property labelled ``label`` whose description is ``description`` (labels repeat across
    sections): its element, the one holding its input and its error."""
    header = "./div[contains(@class,'p-label__header')]"
    xpath = (
        "//div[contains(@class,'schema-form-property')]"
        f"[{header}//span[normalize-space()='{label} (Optional)']]"
        f'[{header}//div[normalize-space()="{description}"]]'
    )
    WebDriverWait(browser, PAGE_TIMEOUT_S).until(
        expected_conditions.presence_of_element_located((By.XPATH, xpath))
    )
    (element,) = browser.find_elements(By.XPATH, xpath)
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", element)
    return element


def type_into(element: Any, text: str) -> None:
    """Replace the field's value with ``text``, once the form has filled in its default (typing
    earlier, the default could land after, or beside, what was typed) and until the field shows it."""
    control = element.find_element(By.XPATH, "./div[contains(@class,'p-label__body')]//input")
    wait_until(lambda: control.get_attribute("value"), PAGE_TIMEOUT_S, "the field's default value", 0.2)
    control.send_keys(Keys.CONTROL, "a")
    control.send_keys(text)
    wait_until(lambda: control.get_attribute("value") == text, PAGE_TIMEOUT_S, f"{text!r} in the field", 0.2)


def press_submit(browser: Any) -> None:
    (button,) = browser.find_elements(By.XPATH, "//button[normalize-space()='Submit']")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", button)
    button.click()


BATCH = ("Batch Size", "B: sequences per optimizer step.")
TENSOR_PARALLEL = (
    "Tensor Parallel Size",
    "vllm engine: GPUs (workers) per actor. Each worker joins the weight group, receives the full tensors "
    "and lets vLLM shard them.",
)
ENGINE = (
    "Engine",
    "Inference engine: transformers (in this environment, CPU) or vllm (its own environment, make vllm-env). "
    "tensor_parallel_size above 1, kv_cache_on_update=recompute and eval.greedy need vllm.",
)


@pytest.mark.parametrize(
    ("changed", "value", "shown_under", "message"),
    [
        (BATCH, "30", BATCH, "30 is not a multiple of 4"),  # rl.batch_size by rl.group_size
        (TENSOR_PARALLEL, "2", ENGINE, "'vllm' was expected"),  # a rule across two sections
    ],
    ids=["divisibility", "engine"],
)
def test_a_cross_field_mistake_is_shown_under_the_field_and_nothing_runs(
    stack,
    form_deployment_id: str,
    browser: Any,
    artifacts: Path,
    changed: tuple[str, str],
    value: str,
    shown_under: tuple[str, str],
    message: str,
    request: pytest.FixtureRequest,
) -> None:
    before = len(form_flow_runs(stack, form_deployment_id))
    browser.get(f"{stack.prefect_ui_url}/deployments/deployment/{form_deployment_id}/run")
    type_into(form_field(browser, *changed), value)
    press_submit(browser)
    where = form_field(browser, *shown_under)
    wait_until(lambda: message in where.text, 60, f"{message!r} under the field {shown_under[0]!r}", 0.5)
    browser.save_screenshot(str(artifacts / f"{request.node.callspec.id}.png"))
    assert "/run" in browser.current_url, "the form left its page: the run was submitted"
    time.sleep(2)  # a submission that slipped through would create its flow run by now
    assert len(form_flow_runs(stack, form_deployment_id)) == before


def test_a_good_change_is_submitted_with_its_value(
    stack, form_deployment_id: str, browser: Any, artifacts: Path
) -> None:
    """The control: the same form, a valid change, and the flow run carries it."""
    browser.get(f"{stack.prefect_ui_url}/deployments/deployment/{form_deployment_id}/run")
    type_into(form_field(browser, *BATCH), "64")
    press_submit(browser)
    resubmitted = False

    def submitted() -> list[Any]:
        nonlocal resubmitted
        runs = form_flow_runs(stack, form_deployment_id)
        if not runs and "/run" in browser.current_url:  # still on the form: what does it say?
            errors = browser.find_elements(By.XPATH, "//*[contains(@class,'p-message--error')]")
            assert not errors, f"the valid form was refused: {[e.text for e in errors]}"
            # The UI's toast for a request the server failed: the stack's Prefect server keeps its state
            # in SQLite, which under a loaded machine once answered "database is locked" (its log). A
            # user clicks Submit again, and so does the test, once; the form's own verdict is above.
            failed_request = "//*[contains(text(),'Something went wrong')]"
            if not resubmitted and browser.find_elements(By.XPATH, failed_request):
                resubmitted = True
                press_submit(browser)
        return runs

    try:
        runs = wait_until(submitted, 120, "the flow run of a valid form", 1.0)
    finally:
        browser.save_screenshot(str(artifacts / "valid-change.png"))
    (run,) = runs
    assert run.parameters["config"]["rl"]["batch_size"] == 64


# ----- the two runs -----


@dataclass
class CancelledRun:
    flow_run_id: str
    run_dir: Path
    stages_while_running: list[tuple[int, str]]
    messages_while_running: list[str]  # the flow run's log messages before the cancel
    mlflow_link_while_running: Any  # its rl-run-mlflow artifact before the cancel (None: none yet)
    answer: Any  # the API's answer to the cancel
    final: Any  # the flow run once final


@pytest.fixture(scope="module")
def cancelled_run(stack, random_model_dir, tmp_path_factory) -> CancelledRun:
    """The same deployment with the default local placement (its stages' logs go to the rl-run flow
    run itself), cancelled through the API once it trains."""
    directory = tmp_path_factory.mktemp("cancelled-run")
    flow_run_id = submit(stack, {"config": small_config(random_model_dir, directory, max_steps=200)})
    runs = directory / "runs"

    def training() -> Path | None:
        flow_run = read_flow_run(stack, flow_run_id)
        assert not flow_run.state.is_final(), f"{flow_run.state}\n{worker_log(stack)}"
        return next(runs.glob("*/metrics.jsonl"), None)

    run_dir = wait_until(training, RUN_TIMEOUT_S, "the local run to start training", interval_s=0.5).parent
    stages = processes_mentioning(str(run_dir))

    def stage_logs() -> list[str] | None:
        messages = flow_run_messages(stack, flow_run_id)
        both = all(any(m.startswith(f"[{stage}]") for m in messages) for stage in ("trainer0", "actor0"))
        return messages if both else None

    messages = settled(stage_logs, 120, "the trainer's and the actor's logs in the flow run") or (
        flow_run_messages(stack, flow_run_id)
    )
    link = settled(lambda: artifacts_of(stack, flow_run_id).get("rl-run-mlflow"), 120, "the MLflow link")
    answer = prefect(
        stack,
        lambda client: client.set_flow_run_state(flow_run_id, Cancelling(message="cancelled by the test")),
    )
    cancelled_at = time.monotonic()
    final = wait_for_final_state(stack, flow_run_id, 180)
    print(f"flow run {final.state_name} {time.monotonic() - cancelled_at:.1f} s after the cancel")
    return CancelledRun(flow_run_id, run_dir, stages, messages, link, answer, final)


def test_a_local_run_streams_its_stages_logs_into_its_flow_run(cancelled_run):
    messages = cancelled_run.messages_while_running
    assert any(message.startswith("[trainer0]") for message in messages), "stage logs reach Prefect"
    assert any(message.startswith("[actor0]") for message in messages)


def test_the_mlflow_link_is_published_while_the_run_runs(cancelled_run):
    link = cancelled_run.mlflow_link_while_running
    assert link is not None, "no rl-run-mlflow artifact before the run ended"
    assert "MLflow run" in link.data


def test_cancelling_a_flow_run_ends_it_cancelled(stack, cancelled_run):
    assert cancelled_run.answer.status.value == "ACCEPT", cancelled_run.answer
    final = cancelled_run.final
    assert final.state.type == StateType.CANCELLED, f"{final.state}\n{worker_log(stack)}"


def test_cancelling_a_flow_run_stops_every_stage(cancelled_run):
    assert cancelled_run.stages_while_running, "the stages ran"
    wait_until(
        lambda: not processes_mentioning(str(cancelled_run.run_dir)),
        120,
        "every stage of the cancelled flow run to exit",
        interval_s=1.0,
    )


def test_a_cancelled_run_is_marked_killed_in_mlflow(stack, cancelled_run):
    flow_run_id = cancelled_run.flow_run_id

    def ended():
        (mlflow_run,) = mlflow_runs_of(stack, flow_run_id)
        return mlflow_run if mlflow_run.info.status != "RUNNING" else None

    mlflow_run = settled(ended, 120, "the MLflow run to end") or mlflow_runs_of(stack, flow_run_id)[0]
    assert mlflow_run.info.status == "KILLED", (
        f"{mlflow_run.info}\nflow run logs:\n{flow_run_logs(stack, flow_run_id)}\n"
        f"worker log:\n{worker_log(stack)}"
    )


# ----- down -----


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
