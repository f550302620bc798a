"""``pipelinerl bench engine --engine transformers --engine vllm --quick`` for real: the command,
started in ``.venv``, runs itself in ``.venv-vllm``; both engines generate the same workload with H
in flight, and vLLM takes in-flight updates over a real gloo weight group from the benchmark
process, with its KV cache kept and recomputed. No timing assertions."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import build_random_model_dir

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"

needs_vllm_env = pytest.mark.skipif(
    not VLLM_PYTHON.exists(), reason=".venv-vllm is absent: build it with `make vllm-env` (CI does)"
)


def assert_updates_went_through(figures: dict[str, Any], runs_sequences: int) -> None:
    """At least one in-flight update, each stall inside its pause, every sequence finished."""
    updates = figures["updates"]
    assert updates["count"] >= 1, "at least one update was applied in flight"
    assert len(updates["stalls_ms"]) == updates["count"]
    assert all(
        0 < stall <= pause for stall, pause in zip(updates["stalls_ms"], updates["pauses_ms"], strict=True)
    )
    assert all(run["sequences"] == runs_sequences for run in figures["update_runs"]), (
        "every sequence finished"
    )


@needs_vllm_env
@pytest.mark.timeout(600)
def test_bench_engine_quick_on_both_engines(tmp_path: Path) -> None:
    # vLLM's CPU attention needs a head size of 32 or more: hidden 128 over 4 heads.
    model_dir = build_random_model_dir(tmp_path / "model", hidden_size=128)
    out = tmp_path / "engine.json"
    command = [sys.executable, "-m", "pipelinerl.cli", "bench", "engine", "--quick"]
    command += [
        "--engine",
        "transformers",
        "--engine",
        "vllm",
        "--model-path",
        str(model_dir),
        "--out",
        str(out),
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=540, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "running in the vLLM environment" in result.stdout
    record = json.loads(out.read_text())
    assert record["benchmark"] == "engine" and record["settings"]["quick"] is True
    assert record["settings"]["engines"] == ["transformers", "vllm"]
    assert record["settings"]["engine"] == "transformers", "the reference engine, as before"
    assert "--engine transformers --engine vllm" in record["command"]
    assert "--recorded-command" not in record["command"], "the command as typed, not its re-run"
    sequences = record["workload"]["sequences"]

    engines = record["engines"]
    assert list(engines) == ["transformers", "vllm"]
    for name, figures in engines.items():
        for key in ("continuous_tokens_per_s", "continuous_over_static_ratio", "update_pause_ms_median"):
            assert math.isfinite(figures[key]) and figures[key] > 0, (name, key, figures[key])
        assert all(run["sequences"] == sequences for run in figures["continuous_runs"]), name
        assert figures["continuous_runs"][0]["cpu_s"] > 0
        assert_updates_went_through(figures, sequences)
    # The top level is the reference engine's, so older readers (bench transport) still work.
    assert record["continuous_tokens_per_s"] == engines["transformers"]["continuous_tokens_per_s"]
    assert record["updates"] == engines["transformers"]["updates"]

    vllm = engines["vllm"]
    assert vllm["version"], "the vLLM version measured"
    assert vllm["compared_with"]["engine"] == "transformers"
    assert vllm["compared_with"]["continuous_tokens_per_s_ratio"] > 0
    phases = vllm["updates"]["phases_ms_median"]
    assert set(phases) == {"pause", "load", "label_resume", "load_in_worker"}
    assert 0 < phases["load_in_worker"] <= phases["load"], "the worker's part is inside the load phase"
    recompute = vllm["kv_cache_recompute"]
    assert_updates_went_through(recompute, sequences)
    assert recompute["tokens_per_s_over_keep"] > 0
    assert "kv_cache_recompute" not in engines["transformers"], "transformers keeps its cache"

    assert "| measure | transformers | vllm | target |" in result.stdout
    assert "| continuous / static (useful tokens/s) |" in result.stdout


def test_a_missing_vllm_environment_is_named(tmp_path: Path, random_model_dir: Path) -> None:
    """Without .venv-vllm the command stops at once and says how to build it (a copy of the package
    outside the repository has no .venv-vllm beside it)."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "pipelinerl", checkout / "pipelinerl")
    command = [sys.executable, "-c", "from pipelinerl.cli import app; app()"]
    command += ["bench", "engine", "--engine", "transformers", "--engine", "vllm", "--quick"]
    command += ["--model-path", str(random_model_dir)]
    result = subprocess.run(command, cwd=checkout, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "make vllm-env" in result.stdout and str(checkout / ".venv-vllm") in result.stdout
