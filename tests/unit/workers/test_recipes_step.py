"""The recipes as the trainer applies them (``policy_step.micro_batch_loss``): each loss, normalisation,
KL term and entropy bonus equal to the RL math called directly on the same forward pass; the step's
diagnostics the trainer logs from them; the overlong penalty the preprocessor adds to rewards."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from pipelinerl.platform.config import load_config
from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.tracking.metrics import trainer_metrics
from pipelinerl.platform.wire import TrainSequence
from pipelinerl.rl.cispo import cispo_loss
from pipelinerl.rl.entropy import entropy_bonus, token_entropy
from pipelinerl.rl.gspo import gspo_loss
from pipelinerl.rl.kl import kl_mean, kl_penalty
from pipelinerl.rl.loss import ppo_clip_loss, truncated_is_loss
from pipelinerl.rl.overlong import overlong_penalty
from pipelinerl.tasks.base import Score
from pipelinerl.workers.policy_step import completion_forward, micro_batch_loss, per_token
from pipelinerl.workers.preprocessor import RewardPolicy, build_batch_builder
from pipelinerl.workers.recipe_terms import recipe_metrics, reference_model_path

TEMPERATURE = 0.8


def sequence(prompt, completion, advantage, behaviour):
    n = len(completion)
    return TrainSequence(
        rollout_id=f"r{prompt}{completion}",
        group_id="g",
        prompt_token_ids=np.array(prompt, dtype=np.int32),
        completion_token_ids=np.array(completion, dtype=np.int32),
        behaviour_logprobs=np.asarray(behaviour, dtype=np.float32),
        token_versions=np.zeros(n, dtype=np.int32),
        reward=1.0,
        advantage=advantage,
        finished=True,
    )


@pytest.fixture(scope="module")
def model(random_model_dir):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def reference(model):
    """A reference policy a little away from ``model`` (as the policy is after some steps)."""
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for param in moved.parameters():
            param.add_(0.05 * torch.randn_like(param))
    return moved.requires_grad_(False)


@pytest.fixture(scope="module")
def batch(model):
    """Three sequences whose behaviour log-probs are the model's own moved by up to +-0.6 nats, so every
    recipe clips some tokens (above and below) and leaves others alone."""
    raw = [([1, 10, 11], [12, 13, 2], 1.0), ([1, 20], [21, 22, 23, 24, 2], -0.5), ([1, 5, 6, 7], [8, 2], 0.7)]
    plain = [sequence(p, c, a, np.zeros(len(c))) for p, c, a in raw]
    with torch.no_grad():
        forward = completion_forward(model, plain, TEMPERATURE)
    rng = np.random.default_rng(0)
    out = []
    for row, (p, c, a) in enumerate(raw):
        own = forward.logprobs[row][forward.mask[row]].numpy()
        out.append(sequence(p, c, a, own + rng.uniform(-0.6, 0.6, size=len(c))))
    return out


def direct_inputs(model, batch):
    forward = completion_forward(model, batch, TEMPERATURE)
    behaviour = per_token(batch, forward.mask, "behaviour_logprobs", torch.float32)
    advantages = torch.tensor([seq.advantage for seq in batch])[:, None].expand(forward.mask.shape)
    return forward, behaviour, advantages.contiguous()


TOKENS = 3 + 5 + 2
# (rl settings, the direct call on (logprobs, behaviour, advantages, mask, denominator))
RECIPES = {
    "truncated_is": (
        {"loss_name": "truncated_is", "is_cap": 1.2},
        lambda *args: truncated_is_loss(*args, is_cap=1.2),
    ),
    "ppo_clip": ({"loss_name": "ppo_clip"}, lambda *args: ppo_clip_loss(*args, clip_epsilon=0.2)),
    "ppo_clip_higher": (
        {"loss_name": "ppo_clip", "clip_low": 0.1, "clip_high": 0.28},
        lambda *args: ppo_clip_loss(*args, clip_epsilon=0.2, clip_low=0.1, clip_high=0.28),
    ),
    "gspo": ({"loss_name": "gspo"}, lambda *args: gspo_loss(*args)),
    "gspo_wide": (
        {"loss_name": "gspo", "clip_low": 0.05, "clip_high": 0.1},
        lambda *args: gspo_loss(*args, clip_low=0.05, clip_high=0.1),
    ),
    "cispo": ({"loss_name": "cispo"}, lambda *args: cispo_loss(*args)),
    "cispo_bounded": (
        {"loss_name": "cispo", "clip_low": 0.2, "clip_high": 0.1},
        lambda *args: cispo_loss(*args, clip_low=0.2, clip_high=0.1),
    ),
}
DENOMINATORS = {"sequence": 3.0, "token": float(TOKENS), "constant": 3.0 * 16}


def run_step(model, batch, settings, normalisation="sequence", **extra):
    options = {"is_cap": 5.0, "ppo_clip_epsilon": 0.2, **settings}
    return micro_batch_loss(
        model,
        batch,
        num_sequences=3,
        temperature=TEMPERATURE,
        normalisation=normalisation,
        num_tokens=TOKENS,
        max_new_tokens=16,
        **options,
        **extra,
    )


@pytest.mark.parametrize("normalisation", list(DENOMINATORS))
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_each_recipe_is_its_loss_called_directly(model, batch, recipe, normalisation):
    settings, direct = RECIPES[recipe]
    result = run_step(model, batch, settings, normalisation)
    forward, behaviour, advantages = direct_inputs(model, batch)
    expected = direct(forward.logprobs, behaviour, advantages, forward.mask, DENOMINATORS[normalisation])
    assert float(result.loss.detach()) == pytest.approx(float(expected.loss.detach()), rel=1e-5, abs=1e-7)
    assert result.clipped_fraction == pytest.approx(expected.clipped_fraction)
    assert result.clipped_low_fraction == pytest.approx(expected.clipped_low_fraction)
    assert result.clipped_high_fraction == pytest.approx(expected.clipped_high_fraction)
    assert result.num_tokens == TOKENS and result.kl_mean is None and result.entropy_mean is None
    # the token record keeps the per-token ratio pi/mu whatever the loss weighs (gspo's is per sequence)
    record = result.tokens
    assert record.ratio == pytest.approx(
        np.exp(record.trainer_logprobs - record.behaviour_logprobs), rel=1e-5
    )


def test_the_batch_clips_on_both_sides(model, batch):
    """The comparisons above run on clipped weights too: the batch has tokens beyond both bounds."""
    result = run_step(model, batch, RECIPES["cispo_bounded"][0])
    assert 0 < result.clipped_low_fraction < 1 and 0 < result.clipped_high_fraction < 1
    assert result.clipped_fraction == pytest.approx(
        result.clipped_low_fraction + result.clipped_high_fraction
    )


def test_clip_higher_clips_fewer_tokens_at_the_upper_bound(model, batch):
    symmetric = run_step(model, batch, {"loss_name": "ppo_clip", "ppo_clip_epsilon": 0.1})
    higher = run_step(model, batch, {"loss_name": "ppo_clip", "ppo_clip_epsilon": 0.1, "clip_high": 0.5})
    assert symmetric.clipped_fraction > 0
    assert higher.clipped_high_fraction <= symmetric.clipped_high_fraction
    assert higher.clipped_low_fraction == pytest.approx(symmetric.clipped_low_fraction)


@pytest.mark.parametrize("recipe", ["truncated_is", "ppo_clip_higher", "gspo", "cispo"])
def test_micro_batch_losses_add_up_to_the_step_loss(model, batch, recipe):
    settings, _ = RECIPES[recipe]
    normalisation = "sequence" if recipe == "gspo" else "token"
    whole = run_step(model, batch, settings, normalisation)
    parts = [
        run_step(model, batch[:1], settings, normalisation),
        run_step(model, batch[1:], settings, normalisation),
    ]
    assert float(sum(part.loss.detach() for part in parts)) == pytest.approx(
        float(whole.loss.detach()), rel=1e-5, abs=1e-7
    )


def test_kl_term_uses_the_reference_in_the_same_micro_batch(model, reference, batch):
    settings, _ = RECIPES["cispo"]
    plain = run_step(model, batch, settings, "token")
    with_kl = run_step(
        model, batch, settings, "token", kl_coef=0.1, kl_estimator="k3", reference_model=reference
    )
    forward, _, _ = direct_inputs(model, batch)
    with torch.no_grad():
        ref = completion_forward(reference, batch, TEMPERATURE)
    kl = kl_penalty(forward.logprobs, ref.logprobs, forward.mask, "k3")
    assert with_kl.kl_mean == pytest.approx(kl_mean(kl, forward.mask), rel=1e-5)
    assert with_kl.kl_mean > 0  # k3 >= 0, and the reference differs
    expected = float(plain.loss.detach()) + 0.1 * float(kl.detach().sum()) / TOKENS
    assert float(with_kl.loss.detach()) == pytest.approx(expected, rel=1e-5, abs=1e-7)
    # the gradient reaches the policy, never the frozen reference
    model.zero_grad()
    with_kl.loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert all(p.grad is None for p in reference.parameters())
    model.zero_grad()


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_the_kl_of_the_policy_to_itself_is_zero(model, batch, estimator):
    result = run_step(
        model, batch, RECIPES["truncated_is"][0], kl_coef=1.0, kl_estimator=estimator, reference_model=model
    )
    assert result.kl_mean == pytest.approx(0.0, abs=1e-6)
    assert float(result.loss.detach()) == pytest.approx(
        float(run_step(model, batch, RECIPES["truncated_is"][0]).loss.detach())
    )


def test_entropy_bonus_from_the_same_forward_pass(model, batch):
    settings, _ = RECIPES["ppo_clip_higher"]
    plain = run_step(model, batch, settings, "constant")
    bonus = run_step(model, batch, settings, "constant", entropy_coef=0.01)
    forward, _, _ = direct_inputs(model, batch)
    entropy = token_entropy(forward.logits, forward.mask)
    assert bonus.entropy_mean == pytest.approx(float(entropy.detach()[forward.mask].mean()), rel=1e-5)
    assert 0 < bonus.entropy_mean <= np.log(model.config.vocab_size) + 1e-4
    expected = float(plain.loss.detach()) + float(
        entropy_bonus(entropy, forward.mask, 0.01, DENOMINATORS["constant"]).detach()
    )
    assert float(bonus.loss.detach()) == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert float(bonus.loss.detach()) < float(
        plain.loss.detach()
    )  # a bonus: the loss goes down as entropy goes up


def test_a_recipe_missing_what_it_needs_is_refused(model, batch):
    with pytest.raises(ValueError, match="reference_model"):
        run_step(model, batch, RECIPES["truncated_is"][0], kl_coef=0.1)
    with pytest.raises(ValueError, match="num_tokens"):
        micro_batch_loss(
            model,
            batch,
            num_sequences=3,
            loss_name="truncated_is",
            is_cap=5.0,
            ppo_clip_epsilon=0.2,
            temperature=1.0,
            normalisation="token",
        )
    with pytest.raises(ValueError, match="truncated_is takes no clip bounds"):
        run_step(model, batch, {"loss_name": "truncated_is", "clip_high": 0.2})
    with pytest.raises(ValueError, match="unknown loss 'grpo'"):
        run_step(model, batch, {"loss_name": "grpo"})


def test_step_metrics_weigh_micro_batches_by_tokens_and_log_kl_and_entropy_only_when_on():
    results = [(10, 0.5, 0.2, 0.3, 0.02, 1.5), (30, 0.1, 0.0, 0.1, 0.06, 0.5)]
    metrics = recipe_metrics(results, kl_coef=0.1, entropy_coef=0.01)
    assert metrics[registry.CLIPPED_FRACTION] == pytest.approx((5 + 3) / 40)
    assert metrics[registry.CLIPPED_LOW_FRACTION] == pytest.approx(2 / 40)
    assert metrics[registry.CLIPPED_HIGH_FRACTION] == pytest.approx((3 + 3) / 40)
    assert metrics[registry.KL_MEAN] == pytest.approx((0.2 + 1.8) / 40)
    assert metrics[registry.ENTROPY_MEAN] == pytest.approx((15 + 15) / 40)
    off = recipe_metrics([(10, 0.0, 0.0, 0.0, None, None)], kl_coef=0.0, entropy_coef=0.0)
    assert set(off) == {
        registry.CLIPPED_FRACTION,
        registry.CLIPPED_LOW_FRACTION,
        registry.CLIPPED_HIGH_FRACTION,
    }
    assert recipe_metrics([], 0.1, 0.1)[registry.KL_MEAN] == 0.0
    for name in metrics:  # declared for the trainer's record, and logged to MLflow from it
        declared = registry.declaration(name)
        assert declared is not None and declared.mlflow and declared.records == {"trainer"}
    assert set(trainer_metrics(metrics)) >= set(metrics)


def test_the_reference_is_the_starting_weights(tmp_path: Path, random_model_dir: Path):
    config = load_config(None, [f"model.path={random_model_dir}", "rl.kl.coef=0.1"])
    assert reference_model_path(config, random_model_dir) == random_model_dir
    checkpoint = tmp_path / "checkpoints" / "v3"
    checkpoint.mkdir(parents=True)
    resumed = config.model_copy(update={"run": config.run.model_copy(update={"resume_from": checkpoint})})
    assert reference_model_path(resumed, checkpoint) == random_model_dir  # not the checkpoint


def test_the_overlong_penalty_is_added_to_the_reward():
    right = Score(1.0, "correct")
    policy = RewardPolicy(overlong_buffer=4, max_length=16)
    assert policy.reward(right, True, 12) == 1.0
    assert policy.reward(right, True, 14) == pytest.approx(1.0 + overlong_penalty(14, 16, 4)) == 0.5
    assert policy.reward(right, False, 16) == 0.0
    assert RewardPolicy().reward(right, False, 16) == 1.0  # off: the length is not looked at
    masked = RewardPolicy("mask", overlong_buffer=4, max_length=16)
    assert masked.reward(right, False, 16) == 0.0 and masked.advantage(0.7, finished=False) == 0.0


def test_the_preprocessor_takes_the_overlong_settings_from_the_config(tmp_path: Path):
    on = load_config(None, ["rl.overlong.enabled=true", "rl.overlong.buffer=8", "actor.max_new_tokens=24"])
    builder = build_batch_builder(on, tmp_path, task=None, problems={})  # type: ignore[arg-type]
    assert (builder.rewards.overlong_buffer, builder.rewards.max_length) == (8, 24)
    off = build_batch_builder(load_config(), tmp_path, task=None, problems={})  # type: ignore[arg-type]
    assert off.rewards.overlong_buffer is None


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["gspo", "cispo_bounded", "ppo_clip_higher"])
def test_a_recipe_with_kl_and_entropy_on_a_gpu_equals_it_on_cpu(model, reference, batch, recipe):
    """The reference model sits on the trainer's device beside the policy; every term is computed there."""
    settings, _ = RECIPES[recipe]
    extra = {"kl_coef": 0.1, "kl_estimator": "k2", "entropy_coef": 0.01}
    on_cpu = run_step(model, batch, settings, reference_model=reference, **extra)
    gpu_model, gpu_reference = copy.deepcopy(model).cuda(), copy.deepcopy(reference).cuda()
    on_gpu = run_step(gpu_model, batch, settings, device="cuda", reference_model=gpu_reference, **extra)
    assert on_gpu.loss.device.type == "cuda"
    assert float(on_gpu.loss.detach()) == pytest.approx(float(on_cpu.loss.detach()), rel=1e-4, abs=1e-6)
    assert on_gpu.kl_mean == pytest.approx(on_cpu.kl_mean, rel=1e-3, abs=1e-7)
    assert on_gpu.entropy_mean == pytest.approx(on_cpu.entropy_mean, rel=1e-4)
