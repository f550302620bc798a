"""Whole runs with ``actor.engine = "vllm"``: the actor in ``.venv-vllm``, the rest in ``.venv``.

The trainer and preprocessor run from this environment; the actor runs under
``.venv-vllm/bin/python`` (``actor.python``) and its vLLM worker joins the trainer's gloo weight
group. Bookkeeping runs use a small random model (head size 32, which vLLM's CPU attention needs);
the learning run uses the embedded warm-started model, as ``pipelinerl run`` does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelinerl.workers.launcher import launch
from tests.conftest import build_random_model_dir
from tests.integration.test_pipeline import check_records_against_token_data, small_config

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not VLLM_PYTHON.exists(), reason=".venv-vllm is absent: build it with `make vllm-env` (CI does)"
    ),
]


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_random_model_dir(tmp_path_factory.mktemp("vllm-model"), hidden_size=128)


# Ports apart from test_pipeline's, so that both modules may run at once.
_next_port = iter(range(22100, 22700, 20))


def vllm_config(tmp_path: Path, model_dir: Path, *overrides: str):
    return small_config(
        tmp_path,
        model_dir,
        "actor.engine=vllm",
        f"actor.python={VLLM_PYTHON}",
        f"transport.base_port={next(_next_port)}",
        *overrides,
    )


def test_vllm_actor_updates_in_flight(tmp_path, vllm_model_dir):
    result = launch(vllm_config(tmp_path, vllm_model_dir, "run.mode=pipeline"))
    summary = result.summary
    assert summary["steps"] == 4 and summary["final_policy_version"] == 4
    assert summary["inflight_sequences"] > 0, "some sequences were written by two or more versions"
    check_records_against_token_data(result)
    actor_records = [json.loads(line) for line in (result.run_dir / "actor0.jsonl").read_text().splitlines()]
    pauses = [record["weights/update_pause_ms"] for record in actor_records]
    assert pauses and max(pauses) < 10_000


def test_vllm_actor_async_mode_stages_weights_in_its_workers(tmp_path, vllm_model_dir):
    result = launch(vllm_config(tmp_path, vllm_model_dir, "run.mode=async", "run.max_lag=1"))
    assert result.summary["steps"] == 4
    assert result.summary["inflight_sequences"] == 0
    check_records_against_token_data(result)


def test_vllm_actor_recomputes_the_cache_on_update(tmp_path, vllm_model_dir):
    config = vllm_config(tmp_path, vllm_model_dir, "run.mode=pipeline", "actor.kv_cache_on_update=recompute")
    result = launch(config)
    assert result.summary["steps"] == 4
    check_records_against_token_data(result)


def test_a_vllm_run_learns_on_the_embedded_default(tmp_path, warm_model_dir):
    """The default experiment (100 steps, 200 held-out problems) with the vLLM actor: held-out
    success rises (measured: 45.0 % -> 61.0 %, and 41 % -> 52 % on 100 problems; about 7 minutes)."""
    result = launch(
        vllm_config(
            tmp_path,
            warm_model_dir,
            "run.max_steps=100",
            "rl.batch_size=32",
            "actor.max_in_flight=32",
            "task.eval_problems=200",
        )
    )
    summary = result.summary
    assert summary["steps"] == 100
    assert summary["eval_success_end"] > summary["eval_success_start"], summary
