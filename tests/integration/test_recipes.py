"""Every training recipe trains end to end: a short real run per recipe (``rl.loss`` with its options, the
loss normalisations, the KL term to a frozen reference, the entropy bonus, the overlong penalty) through
``launch`` as ``pipelinerl run`` does: gspo, ppo_clip and truncated_is in pipeline mode, cispo in
conventional mode (each mode's path once: four runs, not one per recipe and mode).

Each run is three steps of a small random model with tracking off (the stages and their records are what
is under test, not the stores); the runs are launched side by side, two at a time, since nearly all of
a run's time is its processes starting. Each test reads the recipe's metrics from ``metrics.jsonl``.

A random model never answers the task, so its rewards alone would all be 0, every advantage 0 and the
policy would never move. The rewards here come from length instead: a completion cut at the budget is
penalised (``rl.truncated=penalise``, or the overlong penalty in the run that has it) while a random
model ends some of its completions earlier (one in eight at the first step, whose batch the seed fixes),
so groups have different rewards, the losses have a gradient, and the later steps train tokens of
weights the trainer has since changed.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipelinerl.launch.launcher import launch
from pipelinerl.platform.config import PipelineConfig, load_config
from pipelinerl.platform.tracking import metric_registry as metric
from tests.conftest import worker_port
from tests.runs import Run

pytestmark = pytest.mark.slow

STEPS = 3
MAX_NEW_TOKENS = 48
PENALISE = "rl.truncated=penalise"  # the reward signal of a random model (see above)
# name -> (the recipe's settings, the run's mode)
RECIPES: dict[str, tuple[tuple[str, ...], str]] = {
    "gspo": (("rl.loss=gspo", PENALISE), "pipeline"),
    "ppo_clip_higher": (
        ("rl.loss=ppo_clip", "rl.clip_low=0.2", "rl.clip_high=0.28", "rl.loss_normalisation=token", PENALISE),
        "pipeline",
    ),
    "truncated_is_kl": (
        (
            "rl.loss=truncated_is",
            "rl.kl.coef=0.1",
            "rl.kl.estimator=k3",
            "rl.entropy_coef=0.01",
            "rl.overlong.enabled=true",
            "rl.overlong.buffer=40",
        ),
        "pipeline",
    ),
    "conventional_cispo": (
        (
            "rl.loss=cispo",
            "rl.clip_high=0.2",
            "rl.loss_normalisation=constant",
            "run.steps_per_round=3",
            PENALISE,
        ),
        "conventional",
    ),
}
# One block of ports per run, within this module's share of the fixed test ports.
PORTS = dict(zip(RECIPES, range(worker_port(24600), worker_port(24700), 20), strict=False))


def recipe_config(tmp_path: Path, model_dir: Path, name: str) -> PipelineConfig:
    settings, mode = RECIPES[name]
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            f"run.output_dir={tmp_path}",
            f"run.home={tmp_path / 'home'}",
            f"run.mode={mode}",
            f"run.max_steps={STEPS}",
            "rl.group_size=4",
            "rl.batch_size=8",
            "actor.max_in_flight=8",
            f"actor.max_new_tokens={MAX_NEW_TOKENS}",
            "task.eval_problems=4",
            "trainer.checkpoint_every=0",
            # steps large enough that the policy visibly moves in three of them
            "trainer.learning_rate=0.001",
            "tracking.enabled=false",
            f"transport.base_port={PORTS[name]}",
            *settings,
        ],
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, random_model_dir: Path) -> dict[str, Run]:
    configs = {name: recipe_config(tmp_path_factory.mktemp(name), random_model_dir, name) for name in RECIPES}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(launch, config) for name, config in configs.items()}
        return {name: Run(configs[name], future.result(timeout=600)) for name, future in futures.items()}


def fraction(value: float) -> bool:
    return 0.0 <= value <= 1.0


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(RECIPES))
def test_the_recipe_trains_its_steps_and_logs_its_diagnostics(runs: dict[str, Run], name: str) -> None:
    run = runs[name]
    assert run.result.summary["steps"] == STEPS, run.result.summary
    records = run.jsonl("metrics.jsonl")
    assert [record[metric.POLICY_VERSION] for record in records] == list(range(1, STEPS + 1))
    kl_on = run.config.rl.kl.coef > 0
    for record in records:
        assert math.isfinite(record[metric.LOSS]), record[metric.LOSS]
        low, high = record[metric.CLIPPED_LOW_FRACTION], record[metric.CLIPPED_HIGH_FRACTION]
        assert fraction(low) and fraction(high) and fraction(record[metric.CLIPPED_FRACTION])
        # the two bounds split the clipped tokens (truncated_is has an upper bound only)
        assert low + high == pytest.approx(record[metric.CLIPPED_FRACTION], abs=1e-9)
        if run.config.rl.loss == "truncated_is":
            assert low == 0.0
        assert (metric.KL_MEAN in record) == kl_on
        assert (metric.ENTROPY_MEAN in record) == (run.config.rl.entropy_coef > 0)
    assert (run.result.run_dir / "final" / "config.json").exists()
    # it trained: a step had a gradient, and a later step's tokens, sampled by weights the trainer has
    # changed since, have ratios away from 1 (an effective sample size below 1)
    assert any(record[metric.LOSS] != 0 for record in records), [r[metric.LOSS] for r in records]
    assert min(record[metric.ESS] for record in records[1:]) < 1 - 1e-6, [r[metric.ESS] for r in records]


@pytest.mark.timeout(900)
def test_the_kl_to_the_frozen_reference_starts_at_zero_and_grows(runs: dict[str, Run]) -> None:
    """The first step's policy is the reference (the starting weights), so its k3 estimate is 0; once the
    policy has moved and the reference has not, it is positive (k3 is never negative)."""
    records = runs["truncated_is_kl"].jsonl("metrics.jsonl")
    kl = [record[metric.KL_MEAN] for record in records]
    assert kl[0] == pytest.approx(0.0, abs=1e-6), kl
    assert all(value >= -1e-9 for value in kl), kl
    assert max(kl[1:]) > 1e-6, kl
    entropy = [record[metric.ENTROPY_MEAN] for record in records]
    model_path = runs["truncated_is_kl"].config.model.path
    assert model_path is not None
    vocab = json.loads((model_path / "config.json").read_text())["vocab_size"]
    assert all(0.0 < value <= math.log(vocab) + 1e-4 for value in entropy), (entropy, vocab)


@pytest.mark.timeout(900)
def test_the_overlong_penalty_lowers_the_rewards(runs: dict[str, Run]) -> None:
    """With a buffer of 40 of 48 tokens every completion longer than 8 tokens is penalised, most of a random
    model's, so the mean reward drops below 0, which no reward of the task reaches alone (that run keeps
    rl.truncated=train)."""
    run = runs["truncated_is_kl"]
    assert run.config.rl.truncated == "train"
    records = run.jsonl("metrics.jsonl")
    assert all(record[metric.REWARD_MEAN] < 0 for record in records), [r[metric.REWARD_MEAN] for r in records]


@pytest.mark.timeout(900)
def test_conventional_rounds_train_a_recipe_on_lagged_tokens(runs: dict[str, Run]) -> None:
    """Conventional mode trains a round's G = 3 steps on tokens of the weights the round began with: the
    later steps' tokens lag, and the recipe still trains them (its weights differ from 1 there)."""
    records = runs["conventional_cispo"].jsonl("metrics.jsonl")
    assert [record[metric.LAG_MAX] for record in records] == [0, 1, 2]
