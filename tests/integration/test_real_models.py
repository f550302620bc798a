"""Real model families and real tasks through the whole pipeline: a few steps each, real processes.

The models are random-weight Qwen2 and Llama models with tokenizers built to mimic their families
(``tests/models.py``): no BOS and a chat template of ``<|im_start|>`` turns; a BOS, no pad token and
Llama 3's chat template; both with several end-of-sequence ids. The tasks are the shipped math set
(math-verify) and two reasoning-gym generators. Random weights learn nothing in a few steps, so the
checks are the plumbing: prompts rendered by the chat template reach the engine, every completion
is scored and its label counted, the trainer takes its steps, held-out success is measured.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelinerl.launch.launcher import launch
from pipelinerl.platform.config import ConfigError, load_config
from tests.conftest import worker_port

pytestmark = pytest.mark.slow

_next_port = iter(range(worker_port(26000), worker_port(26400), 20))


def config_for(tmp_path: Path, model_dir: Path, *overrides: str):
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            f"run.output_dir={tmp_path}",
            f"run.home={tmp_path / 'home'}",
            "run.max_steps=2",
            "rl.group_size=4",
            "rl.batch_size=8",
            "actor.max_in_flight=8",
            "actor.max_new_tokens=24",
            "task.train_problems=64",
            "task.eval_problems=8",
            f"transport.base_port={next(_next_port)}",
            *overrides,
        ],
    )


def scored_labels(run_dir: Path) -> dict[str, int]:
    last = json.loads((run_dir / "preprocessor.jsonl").read_text().splitlines()[-1])
    return {key.removeprefix("scores/"): value for key, value in last.items() if key.startswith("scores/")}


@pytest.mark.parametrize("family", ["qwen_style", "llama_style"])
def test_math_on_a_chat_model_of_each_family(tmp_path, family, request):
    model_dir = request.getfixturevalue(f"{family}_model_dir")
    config = config_for(
        tmp_path, model_dir, "task.name=math", "model.system_prompt=You are a careful solver."
    )
    result = launch(config, run_id=f"math-{family}")
    assert result.summary["steps"] == 2 and result.summary["final_policy_version"] == 2
    labels = scored_labels(result.run_dir)
    assert set(labels) == {"correct", "wrong", "no_answer", "unparsable"}
    assert sum(labels.values()) >= 2 * config.rl.batch_size, "every trained rollout was scored"
    trained = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(record["samples"] == config.rl.batch_size for record in trained)


@pytest.mark.parametrize("generator", ["basic_arithmetic", "chain_sum"])
def test_reasoning_gym_generators_on_the_qwen_style_model(tmp_path, generator, qwen_style_model_dir):
    config = config_for(
        tmp_path, qwen_style_model_dir, "task.name=reasoning_gym", f"task.options.generator={generator}"
    )
    result = launch(config, run_id=f"gym-{generator}")
    assert result.summary["steps"] == 2
    assert sum(scored_labels(result.run_dir).values()) >= 2 * config.rl.batch_size


def test_bad_task_input_stops_the_run_before_any_process_starts(tmp_path, qwen_style_model_dir):
    def fails(*overrides: str, match: str) -> None:
        config = config_for(tmp_path, qwen_style_model_dir, *overrides)
        with pytest.raises(ConfigError, match=match):
            launch(config, run_id="bad")
        assert not (tmp_path / "bad").exists(), "nothing was started"

    fails("task.name=math", f"task.options.dataset={tmp_path / 'missing.jsonl'}", match="missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    fails("task.name=math", f"task.options.dataset={tmp_path / 'empty.jsonl'}", match="empty.jsonl")
    (tmp_path / "fields.jsonl").write_text('{"q": "1+1", "a": "2"}\n')
    fails("task.name=math", f"task.options.dataset={tmp_path / 'fields.jsonl'}", match="question")
    fails("task.name=reasoning_gym", "task.options.generator=chain_summ", match="chain_sum")
    fails("model.chat_template=/no/such/template.jinja", match="no such file")


def test_a_model_directory_without_a_tokenizer_is_named(tmp_path, random_model_dir):
    import shutil

    bare = tmp_path / "model-without-tokenizer"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(random_model_dir / name, bare / name)
    with pytest.raises(ConfigError, match="no usable tokenizer"):
        launch(config_for(tmp_path, bare), run_id="bare")


@pytest.mark.parametrize("mode", ["pipeline", "conventional"])
def test_held_out_evaluation_during_the_run_reaches_mlflow(tmp_path, random_model_dir, mode):
    """eval.every=2 on the actor's own engine: eval/heldout/pass_at_1 at several versions, in MLflow.

    Conventional rounds evaluate with the round's frozen weights at v2, v4, v6; in pipeline mode an
    update may land while a round is written (its versions then differ by one or two)."""
    from mlflow.tracking import MlflowClient

    from pipelinerl.platform.tracking.mlflow_store import mlflow_uri

    config = config_for(
        tmp_path,
        random_model_dir,
        f"run.mode={mode}",
        "run.steps_per_round=2",
        "run.max_steps=8",
        "eval.every=2",
        "eval.samples=2",
    )
    result = launch(config, run_id=f"eval-{mode}")
    records = [json.loads(line) for line in (result.run_dir / "eval.jsonl").read_text().splitlines()]
    versions = [record["policy_version"] for record in records]
    # Rounds are due at v2, v4, v6; each fills the engine's slots ahead of new training prompts, so
    # a round finishes within about one trainer step: at least the first two are in before v8. The
    # engine's version may pass a multiple of 2 while the actor waits (backpressure), so a round can
    # start a version or two late, never twice for one multiple nor before v2.
    assert len(versions) >= 2 and versions[0] >= 2, versions
    multiples = [version // 2 for version in versions]
    assert multiples == sorted(set(multiples)), f"one round per multiple of eval.every: {versions}"
    for record in records:
        assert record["problems"] == config.task.eval_problems and record["samples"] == 2
        assert sum(record["labels"].values()) == config.task.eval_problems * 2
        assert 0.0 <= record["pass@1"] <= record["pass@2"] <= 1.0
        if mode == "conventional":  # a round's weights are frozen: one version per eval sequence
            assert record["mixed_version_fraction"] == 0.0
    client = MlflowClient(tracking_uri=mlflow_uri(config))
    run_id = (result.run_dir / "mlflow_run_id").read_text()
    history = client.get_metric_history(run_id, "eval/heldout/pass_at_1")
    assert sorted(point.step for point in history) == versions
    assert [e["policy_version"] for e in result.summary["eval_in_run"]] == versions


def test_a_bfloat16_policy_trains_and_reaches_the_actor_with_two_eval_sets(tmp_path, qwen_style_model_dir):
    """model.dtype=bfloat16 on CPU: DeepSpeed trains bf16 weights (float32 master copy), the actor's
    engine loads and receives bf16, the saved policy is bf16; eval.sets adds a second named set, the
    same generator with longer chains, evaluated through the engine beside the task's own."""
    from safetensors import safe_open

    config = config_for(
        tmp_path,
        qwen_style_model_dir,
        "model.dtype=bfloat16",
        "task.name=reasoning_gym",
        'task.options={generator="chain_sum", params={min_terms=2, max_terms=2}}',
        "eval.every=1",
        "eval.sets={long_chains={params={min_terms=5, max_terms=5}}}",
        "task.eval_problems=4",
        # Six steps: under load the rounds due at v1..v3 can all be cut short by a 4-step run's end.
        "run.max_steps=6",
    )
    result = launch(config, run_id="bf16")
    assert result.summary["final_policy_version"] == 6
    weights = result.run_dir / "final" / "model.safetensors"
    with safe_open(str(weights), framework="pt") as saved:
        dtypes = {str(saved.get_slice(name).get_dtype()) for name in saved.keys()}  # noqa: SIM118
    assert dtypes == {"BF16"}, dtypes
    actor_log = (result.run_dir / "logs" / "actor0.log").read_text()
    assert "transformers engine, bfloat16 weights" in actor_log
    assert "weights v3 loaded in flight" in actor_log, actor_log[-2000:]
    records = [json.loads(line) for line in (result.run_dir / "eval.jsonl").read_text().splitlines()]
    by_set: dict[str, list[int]] = {}
    for record in records:
        by_set.setdefault(record["set"], []).append(record["policy_version"])
        assert sum(record["labels"].values()) == config.task.eval_problems
    # Rounds are due at v1..v5 (the run may end before the last are written); each round submits
    # both sets at the same version.
    assert set(by_set) == {"heldout", "long_chains"}, by_set
    assert set(by_set["heldout"]) & set(by_set["long_chains"]), by_set


def test_the_embedded_model_warm_starts_on_a_reasoning_gym_task_and_trains(tmp_path):
    """No model.path on a task other than arithmetic: the tiny model is warm-started on the generator's
    reference answers (a few steps here), cached under the task's options, and the run trains on it."""
    config = load_config(
        None,
        [
            f"run.output_dir={tmp_path}",
            f"run.home={tmp_path / 'home'}",
            "run.max_steps=2",
            "model.warmstart_max_steps=10",
            "task.name=reasoning_gym",
            'task.options={generator="spell_backward", params={min_word_len=3, max_word_len=5}}',
            "task.train_problems=64",
            "task.eval_problems=8",
            "rl.group_size=4",
            "rl.batch_size=8",
            "actor.max_in_flight=8",
            "actor.max_new_tokens=24",
            f"transport.base_port={next(_next_port)}",
        ],
    )
    result = launch(config, run_id="gym-embedded")
    assert result.summary["final_policy_version"] == 2
    (cached,) = (tmp_path / "home" / "warmstart").glob("reasoning_gym-tiny-*")
    metadata = json.loads((cached / "warmstart.json").read_text())
    assert metadata["settings"]["task_options"]["generator"] == "spell_backward"
    assert metadata["settings"]["max_positions"] == 512
    assert sum(scored_labels(result.run_dir).values()) >= 2 * config.rl.batch_size


def test_a_task_the_embedded_model_cannot_learn_is_refused_before_any_process_starts(tmp_path):
    too_long = load_config(
        None,
        [
            f"run.output_dir={tmp_path}",
            f"run.home={tmp_path / 'home'}",
            "task.name=math",
            "actor.max_new_tokens=600",
        ],
    )
    with pytest.raises(ConfigError, match="more than its 512 positions"):
        launch(too_long, run_id="too-long")
    assert not (tmp_path / "too-long").exists()
