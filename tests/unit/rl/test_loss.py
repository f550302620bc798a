"""Policy losses: hand-computed values, analytic gradients, masking and micro-batch additivity."""

import math

import pytest
import torch

from pipelinerl.rl import loss as loss_module
from pipelinerl.rl.loss import ppo_clip_loss, truncated_is_loss


def _truncated_is_example() -> dict[str, torch.Tensor]:
    # ratios pi/mu = [1, 10, 0.5, 1]; the last token is masked out.
    return {
        "logprobs": torch.tensor([0.5, 0.5, 0.1, 0.3], dtype=torch.float64).log().requires_grad_(),
        "behaviour_logprobs": torch.tensor([0.5, 0.05, 0.2, 0.3], dtype=torch.float64).log(),
        "advantages": torch.tensor([2.0, 1.0, -1.0, 7.0], dtype=torch.float64),
        "token_mask": torch.tensor([True, True, True, False]),
    }


def test_truncated_is_hand_example_value_weights_and_clipped_fraction() -> None:
    inputs = _truncated_is_example()
    output = truncated_is_loss(**inputs, num_sequences=2, is_cap=5.0)

    # weights [1, min(10, 5), 0.5] on the masked-in tokens
    expected = -(2 * 1 * math.log(0.5) + 1 * 5 * math.log(0.5) + (-1) * 0.5 * math.log(0.1)) / 2
    assert output.loss.item() == pytest.approx(expected, rel=1e-12)
    assert output.ratio.tolist() == pytest.approx([1.0, 10.0, 0.5, 0.0], rel=1e-12)
    assert output.importance_weights.tolist() == pytest.approx([1.0, 5.0, 0.5, 0.0], rel=1e-12)
    assert output.clipped_fraction == pytest.approx(1 / 3)
    assert not output.ratio.requires_grad
    assert not output.importance_weights.requires_grad


def test_truncated_is_gradient_is_minus_advantage_times_weight_over_num_sequences() -> None:
    inputs = _truncated_is_example()
    truncated_is_loss(**inputs, num_sequences=2, is_cap=5.0).loss.backward()
    assert inputs["logprobs"].grad is not None
    assert inputs["logprobs"].grad.tolist() == pytest.approx([-1.0, -2.5, 0.25, 0.0], rel=1e-12)


def test_truncated_is_gradient_matches_analytic_on_random_batch() -> None:
    torch.manual_seed(0)
    logprobs = (-torch.rand(3, 7, dtype=torch.float64) * 3).requires_grad_()
    behaviour_logprobs = logprobs.detach() + 0.8 * torch.randn(3, 7, dtype=torch.float64)
    advantages = torch.randn(3, 1, dtype=torch.float64).expand(3, 7).contiguous()
    token_mask = torch.rand(3, 7) > 0.3
    output = truncated_is_loss(
        logprobs, behaviour_logprobs, advantages, token_mask, num_sequences=5, is_cap=2.0
    )
    output.loss.backward()

    ratio = torch.exp(logprobs.detach() - behaviour_logprobs)
    assert (ratio > 2.0)[token_mask].any(), "the example must exercise the cap"
    weights = ratio.clamp(max=2.0)
    expected_grad = torch.where(token_mask, -advantages * weights / 5, torch.zeros_like(weights))
    assert logprobs.grad is not None
    torch.testing.assert_close(logprobs.grad, expected_grad)


def test_on_policy_weights_are_one_and_loss_is_plain_reinforce() -> None:
    logprobs = torch.tensor([[-0.2, -1.5], [-0.7, -3.0]], dtype=torch.float64)
    advantages = torch.tensor([[1.0, 1.0], [-0.5, -0.5]], dtype=torch.float64)
    token_mask = torch.ones(2, 2, dtype=torch.bool)
    output = truncated_is_loss(logprobs, logprobs.clone(), advantages, token_mask, num_sequences=2)
    assert output.importance_weights.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert output.clipped_fraction == 0.0
    assert output.loss.item() == pytest.approx(-(-0.2 - 1.5 + 0.5 * 0.7 + 0.5 * 3.0) / 2)


@pytest.mark.parametrize("loss_fn", [truncated_is_loss, ppo_clip_loss])
def test_micro_batch_losses_and_gradients_sum_to_the_step(loss_fn) -> None:
    torch.manual_seed(1)
    logprobs = (-torch.rand(4, 6, dtype=torch.float64) * 2).requires_grad_()
    behaviour_logprobs = logprobs.detach() + 0.3 * torch.randn(4, 6, dtype=torch.float64)
    advantages = torch.randn(4, 1, dtype=torch.float64).expand(4, 6).contiguous()
    token_mask = torch.rand(4, 6) > 0.2

    step_loss = loss_fn(logprobs, behaviour_logprobs, advantages, token_mask, num_sequences=4).loss
    (step_grad,) = torch.autograd.grad(step_loss, logprobs)
    micro_losses = [
        loss_fn(
            logprobs[rows], behaviour_logprobs[rows], advantages[rows], token_mask[rows], num_sequences=4
        ).loss
        for rows in (slice(0, 1), slice(1, 4))
    ]
    (micro_grad,) = torch.autograd.grad(sum(micro_losses), logprobs)
    assert sum(loss.item() for loss in micro_losses) == pytest.approx(step_loss.item(), rel=1e-12)
    torch.testing.assert_close(micro_grad, step_grad)


@pytest.mark.parametrize("loss_fn", [truncated_is_loss, ppo_clip_loss])
def test_garbage_in_masked_positions_does_not_leak(loss_fn) -> None:
    logprobs = torch.tensor([-0.5, 80.0, -1.0], dtype=torch.float64, requires_grad=True)
    behaviour_logprobs = torch.tensor([-0.5, -200.0, -1.0], dtype=torch.float64)
    advantages = torch.tensor([1.0, float("nan"), 2.0], dtype=torch.float64)
    token_mask = torch.tensor([True, False, True])
    output = loss_fn(logprobs, behaviour_logprobs, advantages, token_mask, num_sequences=1)
    output.loss.backward()
    assert logprobs.grad is not None
    assert torch.isfinite(logprobs.grad).all()
    assert logprobs.grad[1].item() == 0.0
    assert output.ratio[1].item() == 0.0
    assert output.importance_weights[1].item() == 0.0
    assert math.isfinite(output.loss.item())


def test_all_tokens_masked_out_gives_zero_loss_and_zero_fraction() -> None:
    logprobs = torch.zeros(2, 3, requires_grad=True)
    output = truncated_is_loss(
        logprobs, torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool), 2
    )
    output.loss.backward()
    assert output.loss.item() == 0.0
    assert output.clipped_fraction == 0.0
    assert logprobs.grad is not None
    assert logprobs.grad.abs().sum().item() == 0.0


def _ppo_example() -> dict[str, torch.Tensor]:
    logprobs = torch.tensor([-0.4, -1.2, -0.9, -2.0], dtype=torch.float64)
    ratios = torch.tensor([1.5, 0.5, 1.1, 0.7], dtype=torch.float64)
    return {
        "logprobs": logprobs.clone().requires_grad_(),
        "behaviour_logprobs": logprobs - ratios.log(),
        "advantages": torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64),
        "token_mask": torch.ones(4, dtype=torch.bool),
    }


def test_ppo_clip_hand_example() -> None:
    inputs = _ppo_example()
    output = ppo_clip_loss(**inputs, num_sequences=2, clip_epsilon=0.2)

    # per token min(rA, clip(r)A):
    # min(1.5, 1.2)=1.2, min(0.5, 0.8)=0.5, min(-1.1, -1.1)=-1.1, min(-0.7, -0.8)=-0.8
    assert output.loss.item() == pytest.approx(-(1.2 + 0.5 - 1.1 - 0.8) / 2, rel=1e-12)
    assert output.clipped_fraction == pytest.approx(0.5)
    assert output.ratio.tolist() == pytest.approx([1.5, 0.5, 1.1, 0.7], rel=1e-12)
    assert output.importance_weights.tolist() == pytest.approx([1.5, 0.5, 1.1, 0.7], rel=1e-12)

    output.loss.backward()
    # clipped tokens get no gradient; for the others d(rA)/dlogprob = rA
    assert inputs["logprobs"].grad is not None
    assert inputs["logprobs"].grad.tolist() == pytest.approx([0.0, -0.25, 0.55, 0.0], rel=1e-12)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"advantages": torch.zeros(3)}, "advantages has shape"),
        ({"behaviour_logprobs": torch.zeros(2, 2)}, "behaviour_logprobs has shape"),
        ({"token_mask": torch.ones(4)}, "bool"),
        ({"num_sequences": 0}, r"num_sequences must be >= 1 .*, got 0"),
        ({"is_cap": 0.0}, "is_cap must be > 0, got 0.0"),
    ],
)
def test_truncated_is_rejects_bad_inputs(overrides: dict, message: str) -> None:
    arguments: dict = {
        "logprobs": torch.zeros(4),
        "behaviour_logprobs": torch.zeros(4),
        "advantages": torch.zeros(4),
        "token_mask": torch.ones(4, dtype=torch.bool),
        "num_sequences": 1,
    }
    arguments.update(overrides)
    with pytest.raises(ValueError, match=message):
        truncated_is_loss(**arguments)


def test_ppo_rejects_non_positive_epsilon() -> None:
    with pytest.raises(ValueError, match="clip_epsilon must be > 0, got -0.1"):
        ppo_clip_loss(**_ppo_example(), num_sequences=1, clip_epsilon=-0.1)


def test_ppo_existing_example_splits_clipped_fraction_by_bound() -> None:
    # ratios [1.5, 0.5, 1.1, 0.7], A [1, 1, -1, -1], eps 0.2: token 0 is clipped at 1.2 (A > 0), token 3 at
    # 0.8 (A < 0); token 1's ratio is below 0.8 but with A > 0 the unclipped term is the minimum.
    output = ppo_clip_loss(**_ppo_example(), num_sequences=2, clip_epsilon=0.2)
    assert output.clipped_low_fraction == pytest.approx(0.25)
    assert output.clipped_high_fraction == pytest.approx(0.25)


def test_truncated_is_fractions_have_no_low_bound() -> None:
    output = truncated_is_loss(**_truncated_is_example(), num_sequences=2, is_cap=5.0)
    assert output.clipped_low_fraction == 0.0
    assert output.clipped_high_fraction == pytest.approx(1 / 3)
    assert output.clipped_high_fraction == output.clipped_fraction


def _clip_higher_example() -> dict[str, torch.Tensor]:
    logprobs = torch.tensor([-0.4, -1.2, -0.9, -2.0, -0.3, -0.6], dtype=torch.float64)
    ratios = torch.tensor([1.5, 0.5, 1.1, 0.7, 1.25, 9.0], dtype=torch.float64)
    return {
        "logprobs": logprobs.clone().requires_grad_(),
        "behaviour_logprobs": logprobs - ratios.log(),
        "advantages": torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0, 3.0], dtype=torch.float64),
        "token_mask": torch.tensor([True, True, True, True, True, False]),
    }


def test_ppo_clip_higher_hand_example() -> None:
    inputs = _clip_higher_example()
    output = ppo_clip_loss(**inputs, num_sequences=2, clip_low=0.2, clip_high=0.28)

    # range [0.8, 1.28]; per token min(rA, clip(r)A) on the five masked-in tokens:
    # min(1.5, 1.28)=1.28 (high), min(0.5, 0.8)=0.5, min(-1.1, -1.1)=-1.1, min(-0.7, -0.8)=-0.8 (low),
    # min(1.25, 1.25)=1.25 (symmetric eps=0.2 would have clipped it to 1.2: clip-higher lets it grow)
    assert output.loss.item() == pytest.approx(-(1.28 + 0.5 - 1.1 - 0.8 + 1.25) / 2, rel=1e-12)
    assert output.clipped_fraction == pytest.approx(2 / 5)
    assert output.clipped_low_fraction == pytest.approx(1 / 5)
    assert output.clipped_high_fraction == pytest.approx(1 / 5)
    assert output.ratio.tolist() == pytest.approx([1.5, 0.5, 1.1, 0.7, 1.25, 0.0], rel=1e-12)

    output.loss.backward()
    # d(rA)/dlogprob = rA on unclipped tokens, divided by -2: [0, -0.25, 0.55, 0, -0.625, masked 0]
    assert inputs["logprobs"].grad is not None
    assert inputs["logprobs"].grad.tolist() == pytest.approx([0.0, -0.25, 0.55, 0.0, -0.625, 0.0], rel=1e-12)


def test_ppo_symmetric_clip_clips_what_clip_higher_lets_through() -> None:
    output = ppo_clip_loss(**_clip_higher_example(), num_sequences=2, clip_epsilon=0.2)
    # 1.25 is now clipped at 1.2 as well: 1.2 replaces 1.25 and a second token is high-clipped
    assert output.loss.item() == pytest.approx(-(1.2 + 0.5 - 1.1 - 0.8 + 1.2) / 2, rel=1e-12)
    assert output.clipped_high_fraction == pytest.approx(2 / 5)
    assert output.clipped_low_fraction == pytest.approx(1 / 5)


@pytest.mark.parametrize(("clip_low", "clip_high"), [(None, None), (0.3, None), (None, 0.3), (0.3, 0.3)])
def test_ppo_bounds_default_to_clip_epsilon(clip_low: float | None, clip_high: float | None) -> None:
    generator = torch.Generator().manual_seed(7)
    logprobs = -torch.rand(3, 5, generator=generator, dtype=torch.float64) * 2
    behaviour = logprobs + 0.6 * torch.randn(3, 5, generator=generator, dtype=torch.float64)
    advantages = torch.randn(3, 1, generator=generator, dtype=torch.float64).expand(3, 5).contiguous()
    mask = torch.rand(3, 5, generator=generator) > 0.2
    symmetric = ppo_clip_loss(logprobs, behaviour, advantages, mask, 3, clip_epsilon=0.3)
    decoupled = ppo_clip_loss(
        logprobs, behaviour, advantages, mask, 3, clip_epsilon=0.3, clip_low=clip_low, clip_high=clip_high
    )
    assert symmetric.clipped_fraction > 0, "the example must exercise the clip"
    assert decoupled.loss.item() == symmetric.loss.item()
    assert decoupled.clipped_fraction == symmetric.clipped_fraction
    assert decoupled.clipped_low_fraction == symmetric.clipped_low_fraction
    assert decoupled.clipped_high_fraction == symmetric.clipped_high_fraction


def test_ppo_clip_fractions_are_disjoint_and_add_up_over_random_trials() -> None:
    generator = torch.Generator().manual_seed(11)
    for _ in range(100):
        logprobs = -torch.rand(4, 6, generator=generator, dtype=torch.float64) * 3
        behaviour = logprobs + torch.randn(4, 6, generator=generator, dtype=torch.float64)
        advantages = torch.randn(4, 6, generator=generator, dtype=torch.float64)
        mask = torch.rand(4, 6, generator=generator) > 0.3
        clip_low, clip_high = (0.05 + 0.5 * torch.rand(2, generator=generator, dtype=torch.float64)).tolist()
        output = ppo_clip_loss(
            logprobs, behaviour, advantages, mask, 4, clip_low=clip_low, clip_high=clip_high
        )
        assert output.clipped_low_fraction + output.clipped_high_fraction == pytest.approx(
            output.clipped_fraction, abs=1e-12
        )
        ratio = torch.exp(logprobs - behaviour)
        num_tokens = int(mask.sum())
        expected_low = ((ratio < 1 - clip_low) & (advantages < 0) & mask).sum().item() / max(num_tokens, 1)
        expected_high = ((ratio > 1 + clip_high) & (advantages > 0) & mask).sum().item() / max(num_tokens, 1)
        assert output.clipped_low_fraction == pytest.approx(expected_low, abs=1e-12)
        assert output.clipped_high_fraction == pytest.approx(expected_high, abs=1e-12)


@pytest.mark.parametrize("loss_fn", [truncated_is_loss, ppo_clip_loss])
def test_masked_positions_never_change_loss_or_gradient_over_random_trials(loss_fn) -> None:
    generator = torch.Generator().manual_seed(3)
    for _ in range(50):
        logprobs = -torch.rand(3, 5, generator=generator, dtype=torch.float64) * 3
        behaviour = logprobs + 0.5 * torch.randn(3, 5, generator=generator, dtype=torch.float64)
        advantages = torch.randn(3, 5, generator=generator, dtype=torch.float64)
        mask = torch.rand(3, 5, generator=generator) > 0.4
        garbage = 1e3 * torch.randn(3, 3, 5, generator=generator, dtype=torch.float64)
        results = []
        for noisy in (False, True):
            parts = [logprobs, behaviour, advantages]
            if noisy:
                parts = [torch.where(mask, part, garbage[i]) for i, part in enumerate(parts)]
            leaf = parts[0].clone().requires_grad_()
            loss = loss_fn(leaf, parts[1], parts[2], mask, 3).loss
            (grad,) = torch.autograd.grad(loss, leaf)
            results.append((loss.detach(), grad))
        torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
        torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=0)


def test_a_float_denominator_divides_like_an_integer_one() -> None:
    inputs = _clip_higher_example()
    as_int = ppo_clip_loss(**inputs, num_sequences=2).loss.item()
    assert ppo_clip_loss(**inputs, num_sequences=2.0).loss.item() == as_int
    tokens = truncated_is_loss(**_truncated_is_example(), num_sequences=3.0).loss.item()
    assert tokens == pytest.approx(truncated_is_loss(**_truncated_is_example(), num_sequences=3).loss.item())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"clip_low": 0.0}, "clip_low must be a finite number > 0, got 0.0"),
        ({"clip_high": -0.1}, "clip_high must be a finite number > 0, got -0.1"),
        ({"clip_high": math.inf}, "clip_high must be a finite number > 0, got inf"),
        ({"clip_low": math.nan}, "clip_low must be a finite number > 0, got nan"),
        ({"num_sequences": math.nan}, r"num_sequences must be >= 1 and finite .*, got nan"),
        ({"num_sequences": math.inf}, r"num_sequences must be >= 1 and finite .*, got inf"),
        ({"num_sequences": 0.5}, r"num_sequences must be >= 1 and finite .*, got 0.5"),
    ],
)
def test_ppo_rejects_bad_clip_bounds_and_denominators(overrides: dict, message: str) -> None:
    arguments: dict = {**_ppo_example(), "num_sequences": 1}
    arguments.update(overrides)
    with pytest.raises(ValueError, match=message):
        ppo_clip_loss(**arguments)


def test_old_private_helper_names_still_work() -> None:
    assert loss_module._masked_log_ratio is loss_module.masked_log_ratio
    assert loss_module._fraction is loss_module.masked_fraction
    with pytest.raises(ValueError, match="num_sequences must be >= 1"):
        loss_module._validate(
            torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.ones(2, dtype=torch.bool), 0
        )
