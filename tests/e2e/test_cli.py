"""The ``pipelinerl`` command as a user runs it: fast help, and failures before any stage starts.

Checked on other modules' runs: that the stages die with a SIGKILLed launcher (test_resume's run,
which kills one), and that ``pipelinerl run`` writes the run directory and reports it (test_tracking's
run, launched with the command)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from pipelinerl.platform.tracking.store import PlatformStore
from tests.conftest import wait_until, worker_port

PIPELINERL = [sys.executable, "-m", "pipelinerl.cli"]


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PIPELINERL, *args], capture_output=True, text=True, timeout=timeout)


def test_help_lists_commands_without_heavy_imports():
    result = run_cli("--help")
    assert result.returncode == 0
    assert "run" in result.stdout and "config" in result.stdout
    # What was imported, not how long it took: torch must not load for --help.
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, pipelinerl.cli; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
    )
    assert probe.stdout.strip() == "False", probe.stderr


def test_bad_value_fails_before_anything_starts(tmp_path):
    result = run_cli("run", "--set", "run.mode=fastest", "--set", f"run.output_dir={tmp_path}")
    assert result.returncode == 2
    assert "run.mode" in result.stdout and "'fastest'" in result.stdout and "pipeline" in result.stdout
    assert not any(tmp_path.iterdir()), "no run directory was created"


def test_missing_model_directory_is_named(tmp_path):
    missing = tmp_path / "no-such-model"
    result = run_cli("run", "--set", f"model.path={missing}", "--set", f"run.output_dir={tmp_path}")
    assert result.returncode == 2
    assert str(missing) in result.stdout.replace("\n", "") and "does not exist" in result.stdout


def test_port_in_use_is_named(tmp_path, random_model_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(
            "run",
            "--set", f"transport.base_port={port}",
            "--set", f"model.path={random_model_dir}",
            "--set", f"run.output_dir={tmp_path}",
        )  # fmt: skip
    assert result.returncode == 1
    assert str(port) in result.stdout and "transport.base_port" in result.stdout
    assert not any(tmp_path.iterdir()), "no run directory was created"


def test_config_show_prints_resolved_values():
    result = run_cli("config", "show", "--set", "rl.batch_size=64")
    assert result.returncode == 0
    assert "rl.batch_size = 64" in result.stdout and "run.mode = 'pipeline'" in result.stdout


@pytest.mark.parametrize("name", ["pipeline", "conventional", "async"])
def test_shipped_configs_validate_through_the_cli(name):
    path = Path(__file__).parents[2] / "configs" / f"{name}.toml"
    result = run_cli("config", "show", "--config", str(path))
    assert result.returncode == 0 and f"run.mode = '{name}'" in result.stdout


def test_compare_rejects_unknown_modes_before_running():
    result = run_cli("compare", "--modes", "pipeline,synchronous")
    assert result.returncode == 2
    assert "'synchronous' is not a mode" in result.stdout
    assert "pipeline, conventional, async" in result.stdout


def test_unreachable_tracking_stores_stop_the_run_at_once(tmp_path, random_model_dir):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    common = [
        "run",
        "--set", f"model.path={random_model_dir}",
        "--set", f"run.output_dir={tmp_path}",
        "--set", f"transport.base_port={worker_port(21970)}",
    ]  # fmt: skip
    server = run_cli(*common, "--set", f"tracking.mlflow_uri=http://127.0.0.1:{port}", timeout=60)
    assert server.returncode == 1
    assert f"MLflow store 'http://127.0.0.1:{port}' is not reachable" in server.stdout
    database = run_cli(
        *common, "--set", f"tracking.database_url=postgresql://postgres@127.0.0.1:{port}/none", timeout=60
    )
    assert database.returncode == 1
    assert (
        f"platform database 'postgresql://postgres@127.0.0.1:{port}/none' is not reachable" in database.stdout
    )
    assert list(tmp_path.iterdir()) == [], "nothing started: no run directory"


def _processes_of(run_dir) -> list:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(str(run_dir) in part for part in process.info["cmdline"] or []):
            found.append(process)
    return found


def _start_long_run(tmp_path, random_model_dir, port: int):
    command = [
        *PIPELINERL, "run",
        "--set", f"model.path={random_model_dir}",
        "--set", f"run.output_dir={tmp_path / 'runs'}",
        "--set", f"run.home={tmp_path / 'home'}",
        "--set", "run.max_steps=500",
        "--set", "rl.batch_size=16",
        "--set", "task.eval_problems=16",
        "--set", f"transport.base_port={port}",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def training() -> Path | None:
        if process.poll() is not None:
            pytest.fail(
                "the run never started training: " + (process.stdout.read() if process.stdout else "")
            )
        metrics = list((tmp_path / "runs").glob("*/metrics.jsonl"))
        return metrics[0].parent if metrics and metrics[0].read_text().count("\n") >= 2 else None

    try:
        run_dir = wait_until(training, timeout_s=300, what="the run's first two steps", interval_s=0.3)
    except BaseException:
        process.kill()
        raise
    return process, run_dir


@pytest.mark.slow
def test_sigterm_stops_every_stage_and_marks_the_run_killed(tmp_path, random_model_dir):
    process, run_dir = _start_long_run(tmp_path, random_model_dir, worker_port(21990))
    assert len(_processes_of(run_dir)) >= 3, "actor, preprocessor and trainer are running"
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 143, output
    assert "stopped" in output
    # The platform's own view, not the libraries' chatter (the database migrated at the start, the
    # model's weights loaded for the held-out evaluation), here written to a pipe as to a log file.
    for chatter in ("setup plugin", "Running upgrade", "Context impl", "Loading weights", "Writing model"):
        assert chatter not in output, f"{chatter!r} in the run's output:\n{output[:3000]}"
    assert _processes_of(run_dir) == [], "no stage outlives the run"
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}")
    if os.environ.get("MLFLOW_TRACKING_URI"):
        client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    assert client.get_run((run_dir / "mlflow_run_id").read_text()).info.status == "KILLED"
    store_url = os.environ.get("PIPELINERL_DATABASE_URL", f"sqlite:///{tmp_path / 'home' / 'platform.db'}")
    assert PlatformStore(store_url).get_run(run_dir.name).run.status == "killed"
