"""Real model families and real tasks through the whole pipeline: a few steps each, real processes.

The models are random-weight Qwen2 and Llama models with tokenizers built to mimic their families
(``tests/models.py``): no BOS and a chat template of ``<|im_start|>`` turns; a BOS, no pad token and
Llama 3's chat template; both with several end-of-sequence ids. The tasks are the shipped math set
(math-verify) and two reasoning-gym generators. Random weights learn nothing in a few steps, so the
checks are the plumbing: prompts rendered by the chat template reach the engine, every completion
is scored and its label counted, the trainer takes its steps, held-out success is measured.

A run costs about 25 s, nearly all of it process start-up, so each is launched once (a
module-scoped fixture) and carries what it can, each property checked by a test of its own: math on
the Llama-style model is also the conventional run (training during the round) with in-run
evaluation; the chain_sum generator's run is the bfloat16 run with two
eval sets; the basic_arithmetic generator's run is the one that warm-starts the embedded model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from safetensors import safe_open

from pipelinerl.launch.launcher import launch
from pipelinerl.platform.config import ConfigError, load_config
from pipelinerl.platform.tracking import metric_registry as metric
from pipelinerl.platform.tracking.mlflow_store import mlflow_uri
from tests.conftest import worker_port
from tests.integration.test_pipeline import check_conventional_rounds
from tests.runs import Run

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
    labels = {}
    for key, value in last.items():
        parts = metric.parts_of(metric.SCORES, key)
        if parts is not None:
            labels[parts["label"]] = value
    return labels


def launch_once(tmp_path: Path, model_dir: Path, run_id: str, *overrides: str) -> Run:
    config = config_for(tmp_path, model_dir, *overrides)
    return Run(config, launch(config, run_id=run_id))


# --- math on each family; in-run evaluation in each mode --------------------------------------------


MATH = ("task.name=math", "model.system_prompt=You are a careful solver.")
# eval.every=2 on the actor's own engine, eight steps: rounds are due at v2, v4, v6.
IN_RUN_EVAL = ("run.steps_per_round=2", "run.max_steps=8", "eval.every=2", "eval.samples=2")
# In pipeline mode an eval round's sequences reach the preprocessor behind every training rollout
# already queued: with the default queue (32 rollouts, 16 KiB socket buffers, 2 batches ahead) that is
# six batches of 8 when the trainer is the slower stage (a loaded machine), and CI once saw the run end
# at v8 before the v2 round came in. A short queue (at most about four batches ahead of a round,
# counting the kernel buffers) and 12 steps leave room for the v2 and v4 rounds whatever the speeds.
PIPELINE_EVAL_ROOM = ("run.max_steps=12", "transport.queue_size=8", "transport.socket_buffer_kib=4")


@pytest.fixture(scope="module")
def math_qwen_style_run(tmp_path_factory, qwen_style_model_dir) -> Run:
    """Also the pipeline-mode run with in-run evaluation, where an update may land while a round is
    written (its versions then differ by one or two)."""
    return launch_once(
        tmp_path_factory.mktemp("math-qwen"),
        qwen_style_model_dir,
        "math-qwen_style",
        *MATH,
        "run.mode=pipeline",
        *IN_RUN_EVAL,
        *PIPELINE_EVAL_ROOM,
    )


@pytest.fixture(scope="module")
def math_llama_style_run(tmp_path_factory, llama_style_model_dir) -> Run:
    """Also the conventional-mode run (G=2, training during the round) with in-run evaluation: each
    round is evaluated with its frozen weights at v2, v4, v6."""
    return launch_once(
        tmp_path_factory.mktemp("math-llama"),
        llama_style_model_dir,
        "math-llama_style",
        *MATH,
        "run.mode=conventional",
        "run.train_during_round=true",
        *IN_RUN_EVAL,
    )


@pytest.mark.parametrize("family", ["qwen_style", "llama_style"])
def test_math_on_a_chat_model_of_each_family(family, request):
    run: Run = request.getfixturevalue(f"math_{family}_run")
    config, result = run.config, run.result
    steps = config.run.max_steps
    assert result.summary["steps"] == steps and result.summary["final_policy_version"] == steps
    labels = scored_labels(result.run_dir)
    assert set(labels) == {"correct", "wrong", "no_answer", "unparsable"}
    assert sum(labels.values()) >= steps * config.rl.batch_size, "every trained rollout was scored"
    trained = run.jsonl("metrics.jsonl")
    assert all(record[metric.TRAINER_SAMPLES] == config.rl.batch_size for record in trained)


@pytest.mark.parametrize(
    ("mode", "run_name"),
    [("pipeline", "math_qwen_style_run"), ("conventional", "math_llama_style_run")],
    ids=["pipeline", "conventional"],
)
def test_held_out_evaluation_during_the_run_reaches_mlflow(mode, run_name, request):
    """eval.every=2 on the actor's own engine: eval/heldout/pass_at_1 at several versions, in MLflow."""
    run: Run = request.getfixturevalue(run_name)
    config, result = run.config, run.result
    assert config.run.mode == mode
    records = run.jsonl("eval.jsonl")
    versions = [record["policy_version"] for record in records]
    # Rounds are due at every multiple of 2; each fills the engine's slots ahead of new training
    # prompts and reaches the preprocessor behind the rollouts already queued, so at least the first
    # two are in before the run ends (PIPELINE_EVAL_ROOM). The engine's version may pass a multiple of 2
    # while the actor waits (backpressure), so a round can start a version or two late, never twice for
    # one multiple nor before v2.
    assert len(versions) >= 2 and versions[0] >= 2, versions
    multiples = [version // 2 for version in versions]
    assert multiples == sorted(set(multiples)), f"one round per multiple of eval.every: {versions}"
    for record in records:
        assert record[metric.EVAL_PROBLEMS] == config.task.eval_problems and record[metric.EVAL_SAMPLES] == 2
        assert sum(record[metric.EVAL_LABELS].values()) == config.task.eval_problems * 2
        pass_at_1 = record[metric.EVAL_PASS_AT.format(k=1)]
        assert 0.0 <= pass_at_1 <= record[metric.EVAL_PASS_AT.format(k=2)] <= 1.0
        if mode == "conventional":  # a round's weights are frozen: one version per eval sequence
            assert record[metric.EVAL_MIXED_VERSION_FRACTION] == 0.0
    client = MlflowClient(tracking_uri=mlflow_uri(config))
    run_id = (result.run_dir / "mlflow_run_id").read_text()
    history = client.get_metric_history(run_id, metric.name_of(metric.EVAL_SET_PASS_AT, set="heldout", k=1))
    assert sorted(point.step for point in history) == versions
    assert [e["policy_version"] for e in result.summary["eval_in_run"]] == versions


def test_conventional_mode_trains_during_the_round_without_mixing_versions(math_llama_style_run):
    """run.train_during_round=true: the trainer takes a round's first step while the actor still
    generates the rest, and no sequence mixes versions (generation, then training: test_pipeline.py)."""
    check_conventional_rounds(math_llama_style_run)


# --- reasoning-gym generators; a bfloat16 policy with two eval sets ----------------------------------


@pytest.fixture(scope="module")
def gym_basic_arithmetic_run(tmp_path_factory) -> Run:
    """No model.path on a task other than arithmetic: the tiny embedded model is warm-started on the
    generator's reference answers (a few steps here), cached under the task's options, and the run
    trains on it."""
    tmp_path = tmp_path_factory.mktemp("gym-embedded")
    config = load_config(
        None,
        [
            f"run.output_dir={tmp_path}",
            f"run.home={tmp_path / 'home'}",
            "run.max_steps=2",
            "model.warmstart_max_steps=3",
            "task.name=reasoning_gym",
            "task.options.generator=basic_arithmetic",
            "task.train_problems=64",
            "task.eval_problems=8",
            "rl.group_size=4",
            "rl.batch_size=8",
            "actor.max_in_flight=8",
            "actor.max_new_tokens=24",
            f"transport.base_port={next(_next_port)}",
        ],
    )
    return Run(config, launch(config, run_id="gym-embedded"))


@pytest.fixture(scope="module")
def gym_chain_sum_run(tmp_path_factory, qwen_style_model_dir) -> Run:
    """model.dtype=bfloat16 on CPU: DeepSpeed trains bf16 weights (float32 master copy), the actor's
    engine loads and receives bf16, the saved policy is bf16; eval.sets adds a second named set, the
    same generator with longer chains, evaluated through the engine beside the task's own."""
    return launch_once(
        tmp_path_factory.mktemp("bf16"),
        qwen_style_model_dir,
        "bf16",
        "model.dtype=bfloat16",
        "task.name=reasoning_gym",
        'task.options={generator="chain_sum", params={min_terms=2, max_terms=2}}',
        "eval.every=1",
        "eval.sets={long_chains={params={min_terms=5, max_terms=5}}}",
        "task.eval_problems=4",
        # The run does not wait for a round in flight: a 6-step run (1 s of training) once ended with only
        # the held-out set of the v1 round in. The pipeline room above (12 steps, a short queue) leaves
        # both sets of the early rounds time to come in whatever the speeds.
        *PIPELINE_EVAL_ROOM,
    )


@pytest.mark.parametrize("generator", ["basic_arithmetic", "chain_sum"])
def test_reasoning_gym_generators_on_the_qwen_style_model(generator, request):
    run: Run = request.getfixturevalue(f"gym_{generator}_run")
    assert run.config.task.options["generator"] == generator
    steps = run.config.run.max_steps
    assert run.result.summary["steps"] == steps
    assert sum(scored_labels(run.result.run_dir).values()) >= steps * run.config.rl.batch_size


def test_a_bfloat16_policy_trains_and_reaches_the_actor(gym_chain_sum_run):
    result = gym_chain_sum_run.result
    assert result.summary["final_policy_version"] == gym_chain_sum_run.config.run.max_steps
    weights = result.run_dir / "final" / "model.safetensors"
    with safe_open(str(weights), framework="pt") as saved:
        dtypes = {str(saved.get_slice(name).get_dtype()) for name in saved.keys()}  # noqa: SIM118
    assert dtypes == {"BF16"}, dtypes
    actor_log = (result.run_dir / "logs" / "actor0.log").read_text()
    assert "transformers engine, bfloat16 weights" in actor_log
    assert "weights v3 loaded in flight" in actor_log, actor_log[-2000:]


def test_a_second_eval_set_is_evaluated_beside_the_task_own(gym_chain_sum_run):
    config = gym_chain_sum_run.config
    by_set: dict[str, list[int]] = {}
    for record in gym_chain_sum_run.jsonl("eval.jsonl"):
        by_set.setdefault(record[metric.EVAL_SET], []).append(record["policy_version"])
        assert sum(record[metric.EVAL_LABELS].values()) == config.task.eval_problems
    # Rounds are due at v1..v11 (the run may end before the last are written); each round submits
    # both sets at the same version.
    assert set(by_set) == {"heldout", "long_chains"}, by_set
    assert set(by_set["heldout"]) & set(by_set["long_chains"]), by_set


# --- refused before any process starts; the embedded model ------------------------------------------


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
    bare = tmp_path / "model-without-tokenizer"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(random_model_dir / name, bare / name)
    with pytest.raises(ConfigError, match="no usable tokenizer"):
        launch(config_for(tmp_path, bare), run_id="bare")


def test_the_embedded_model_warm_starts_on_a_reasoning_gym_task_and_trains(gym_basic_arithmetic_run):
    config, result = gym_basic_arithmetic_run.config, gym_basic_arithmetic_run.result
    assert config.model.path is None
    assert result.summary["final_policy_version"] == 2
    (cached,) = (config.run.home / "warmstart").glob("reasoning_gym-tiny-*")
    metadata = json.loads((cached / "warmstart.json").read_text())
    assert metadata["settings"]["task_options"]["generator"] == "basic_arithmetic"
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
