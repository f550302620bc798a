"""The ``pipelinerl`` command as a user runs it: fast help, and failures before any stage starts."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

PIPELINERL = [sys.executable, "-m", "pipelinerl.cli"]


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PIPELINERL, *args], capture_output=True, text=True, timeout=timeout)


def test_help_lists_commands_without_heavy_imports():
    started = time.perf_counter()
    result = run_cli("--help")
    elapsed = time.perf_counter() - started
    assert result.returncode == 0
    assert "run" in result.stdout and "config" in result.stdout
    # Not a timing assertion on speed, but on what was imported: torch must not load for --help.
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, pipelinerl.cli; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
    )
    assert probe.stdout.strip() == "False", probe.stderr
    assert elapsed < 30


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


SUMMARY_FIELDS = {
    "mode", "steps", "final_policy_version", "eval_success_start", "eval_success_end", "eval_samples",
    "ess_mean", "lag_mean", "lag_max", "inflight_sequences", "wall_s", "tokens_per_s",
}  # fmt: skip


@pytest.mark.slow
def test_run_writes_the_run_directory(tmp_path, random_model_dir):
    import json

    result = run_cli(
        "run",
        "--set", f"model.path={random_model_dir}",
        "--set", f"run.output_dir={tmp_path}",
        "--set", "run.max_steps=3",
        "--set", "rl.batch_size=16",
        "--set", "task.eval_problems=16",
        "--set", "transport.base_port=21950",
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run_dir,) = list(tmp_path.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary.keys() >= SUMMARY_FIELDS
    assert summary["steps"] == summary["final_policy_version"] == 3 and summary["eval_samples"] == 16
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in records] == [1, 2, 3]
    assert json.loads((run_dir / "config.json").read_text())["run"]["max_steps"] == 3
    assert "held-out success" in result.stdout and "sequences written by 2+ versions" in result.stdout
    assert "MLflow run" in result.stdout
    assert (run_dir / "mlflow_run_id").read_text() in result.stdout.replace("\n", "")


def test_compare_rejects_unknown_modes_before_running():
    result = run_cli("compare", "--modes", "pipeline,synchronous")
    assert result.returncode == 2
    assert "'synchronous' is not a mode" in result.stdout
    assert "pipeline, conventional, async" in result.stdout


def test_unreachable_tracking_stores_stop_the_run_at_once(tmp_path, random_model_dir):
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    common = [
        "run",
        "--set", f"model.path={random_model_dir}",
        "--set", f"run.output_dir={tmp_path}",
        "--set", "transport.base_port=21970",
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
