"""``pipelinerl bench engine --engine vllm --quick`` for real: the command, started in ``.venv``, runs
itself in ``.venv-vllm``; vLLM's engine generates the workload with H in flight and takes in-flight
updates over a real gloo weight group from the benchmark process. No timing assertions."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import build_random_model_dir

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON.exists(), reason=".venv-vllm is absent: build it with `make vllm-env` (CI does)"
)


def test_bench_engine_quick_on_vllm(tmp_path: Path) -> None:
    # vLLM's CPU attention needs a head size of 32 or more: hidden 128 over 4 heads.
    model_dir = build_random_model_dir(tmp_path / "model", hidden_size=128)
    out = tmp_path / "engine-vllm.json"
    command = [sys.executable, "-m", "pipelinerl.cli", "bench", "engine", "--engine", "vllm", "--quick"]
    command += ["--model-path", str(model_dir), "--out", str(out)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "running in the vLLM environment" in result.stdout
    record = json.loads(out.read_text())
    assert record["benchmark"] == "engine" and record["settings"]["engine"] == "vllm"
    assert record["settings"]["quick"] is True
    for key in ("continuous_tokens_per_s", "static_useful_tokens_per_s", "update_pause_ms_median"):
        assert math.isfinite(record[key]) and record[key] > 0, (key, record[key])
    updates = record["updates"]
    assert updates["count"] >= 1, "at least one update went over the weight group in flight"
    assert len(updates["stalls_ms"]) == updates["count"]
    phases = updates["phases_ms_median"]
    assert set(phases) == {"pause", "load", "label_resume", "load_in_worker"}
    assert 0 < phases["load_in_worker"] <= phases["load"], "the worker's part is inside the load phase"
    assert all(
        0 < stall <= pause for stall, pause in zip(updates["stalls_ms"], updates["pauses_ms"], strict=True)
    )
    runs = record["continuous_runs"] + record["update_runs"]
    assert all(run["sequences"] == record["workload"]["sequences"] for run in runs), "every sequence finished"
    assert "| continuous / static (useful tokens/s) |" in result.stdout
    assert record["continuous_runs"][0]["cpu_s"] > 0, "CPU time counts the engine's own processes"


def test_a_missing_vllm_environment_is_named(tmp_path: Path, random_model_dir: Path) -> None:
    """Without .venv-vllm the command stops at once and says how to build it."""
    import shutil

    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "pipelinerl", checkout / "pipelinerl")
    command = [sys.executable, "-c", "from pipelinerl.cli import app; app()"]
    command += ["bench", "engine", "--engine", "vllm", "--quick", "--model-path", str(random_model_dir)]
    result = subprocess.run(command, cwd=checkout, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "make vllm-env" in result.stdout and str(checkout / ".venv-vllm") in result.stdout
