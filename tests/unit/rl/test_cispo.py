"""CISPO: hand-computed clipped weights, loss and gradients; masking, micro-batches, truncated IS."""

import math

import pytest
import torch

from pipelinerl.rl.cispo import cispo_loss
from pipelinerl.rl.loss import ppo_clip_loss, truncated_is_loss


def _hand_example() -> dict[str, torch.Tensor]:
    # ratios pi/mu: row 0 [1.5, 0.5, masked (garbage 1e30)], row 1 [1.2, 0.9, 3.0]; A = +1 and -2
    logprobs = torch.tensor([[-0.5, -1.0, -2.0], [-0.2, -0.7, -1.1]], dtype=torch.float64)
    ratios = torch.tensor([[1.5, 0.5, 1e30], [1.2, 0.9, 3.0]], dtype=torch.float64)
    return {
        "logprobs": logprobs.clone().requires_grad_(),
        "behaviour_logprobs": logprobs - ratios.log(),
        "advantages": torch.tensor([[1.0, 1.0, float("nan")], [-2.0, -2.0, -2.0]], dtype=torch.float64),
        "token_mask": torch.tensor([[True, True, False], [True, True, True]]),
    }


def _assert_rows(got: torch.Tensor, expected: list[list[float]]) -> None:
    torch.testing.assert_close(got.detach(), torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)


def test_hand_example_without_lower_bound() -> None:
    inputs = _hand_example()
    output = cispo_loss(**inputs, denominator=5.0, clip_high=0.28)

    # weights min(r, 1.28): row 0 [1.28, 0.5], row 1 [1.2, 0.9, 1.28]
    _assert_rows(output.importance_weights, [[1.28, 0.5, 0.0], [1.2, 0.9, 1.28]])
    _assert_rows(output.ratio, [[1.5, 0.5, 0.0], [1.2, 0.9, 3.0]])
    lp = inputs["logprobs"].detach()
    expected = (
        -(1.28 * lp[0, 0] + 0.5 * lp[0, 1] - 2 * (1.2 * lp[1, 0] + 0.9 * lp[1, 1] + 1.28 * lp[1, 2])).item()
        / 5
    )
    assert output.loss.item() == pytest.approx(expected, rel=1e-12)
    # 1.5 and 3.0 exceed 1.28: 2 of 5 masked-in tokens, all at the upper bound
    assert output.clipped_fraction == pytest.approx(2 / 5)
    assert output.clipped_high_fraction == pytest.approx(2 / 5)
    assert output.clipped_low_fraction == 0.0

    output.loss.backward()
    # -A w / 5 at every masked-in token, clipped ones included: [-0.256, -0.1], [0.48, 0.36, 0.512]
    assert inputs["logprobs"].grad is not None
    _assert_rows(inputs["logprobs"].grad, [[-0.256, -0.1, 0.0], [0.48, 0.36, 0.512]])


def test_hand_example_with_lower_bound() -> None:
    inputs = _hand_example()
    output = cispo_loss(**inputs, denominator=5.0, clip_low=0.2, clip_high=0.28)
    # 0.5 is raised to 0.8: one more clipped token, at the lower bound
    _assert_rows(output.importance_weights, [[1.28, 0.8, 0.0], [1.2, 0.9, 1.28]])
    assert output.clipped_fraction == pytest.approx(3 / 5)
    assert output.clipped_low_fraction == pytest.approx(1 / 5)
    assert output.clipped_high_fraction == pytest.approx(2 / 5)
    output.loss.backward()
    assert inputs["logprobs"].grad is not None
    _assert_rows(inputs["logprobs"].grad, [[-0.256, -0.16, 0.0], [0.48, 0.36, 0.512]])


def test_every_token_keeps_a_gradient_where_ppo_drops_clipped_ones() -> None:
    inputs = _hand_example()
    cispo_grad = torch.autograd.grad(cispo_loss(**inputs, denominator=5.0).loss, inputs["logprobs"])[0]
    ppo = ppo_clip_loss(**inputs, num_sequences=5, clip_low=0.2, clip_high=0.28)
    ppo_grad = torch.autograd.grad(ppo.loss, inputs["logprobs"])[0]
    mask = inputs["token_mask"]
    assert (cispo_grad[mask] != 0).all()
    assert (ppo_grad[mask] == 0).sum().item() == 1, (
        "PPO drops the gradient of the token clipped at 1.28 with A>0"
    )


def _random_batch(generator: torch.Generator, rows: int = 4, cols: int = 6, spread: float = 0.6):
    logprobs = -torch.rand(rows, cols, generator=generator, dtype=torch.float64) * 3
    behaviour = logprobs + spread * torch.randn(rows, cols, generator=generator, dtype=torch.float64)
    advantages = (
        torch.randn(rows, 1, generator=generator, dtype=torch.float64).expand(rows, cols).contiguous()
    )
    mask = torch.rand(rows, cols, generator=generator) > 0.3
    return logprobs, behaviour, advantages, mask


def test_gradient_matches_analytic_over_random_trials() -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        logprobs, behaviour, advantages, mask = _random_batch(generator)
        logprobs.requires_grad_()
        output = cispo_loss(logprobs, behaviour, advantages, mask, 3.0, clip_low=0.2, clip_high=0.28)
        (grad,) = torch.autograd.grad(output.loss, logprobs)
        weights = torch.exp(logprobs.detach() - behaviour).clamp(0.8, 1.28)
        expected = torch.where(mask, -advantages * weights / 3.0, torch.zeros_like(weights))
        torch.testing.assert_close(grad, expected)


def test_masked_positions_never_change_loss_or_gradient_over_random_trials() -> None:
    generator = torch.Generator().manual_seed(1)
    for _ in range(50):
        logprobs, behaviour, advantages, mask = _random_batch(generator)
        garbage = 1e3 * torch.randn(3, *mask.shape, generator=generator, dtype=torch.float64)
        results = []
        for noisy in (False, True):
            parts = [logprobs, behaviour, advantages]
            if noisy:
                parts = [torch.where(mask, part, garbage[i]) for i, part in enumerate(parts)]
            leaf = parts[0].clone().requires_grad_()
            output = cispo_loss(leaf, parts[1], parts[2], mask, 4.0, clip_low=0.2)
            (grad,) = torch.autograd.grad(output.loss, leaf)
            results.append((output.loss.detach(), grad, output.ratio, output.importance_weights))
            results[-1] += (
                output.clipped_fraction,
                output.clipped_low_fraction,
                output.clipped_high_fraction,
            )
        for clean, noisy_result in zip(results[0], results[1], strict=True):
            if isinstance(clean, torch.Tensor):
                torch.testing.assert_close(clean, noisy_result, rtol=0, atol=0)
            else:
                assert clean == noisy_result


def test_micro_batches_sum_to_the_step_over_random_trials() -> None:
    generator = torch.Generator().manual_seed(2)
    for _ in range(50):
        logprobs, behaviour, advantages, mask = _random_batch(generator, rows=5)
        logprobs.requires_grad_()
        step = cispo_loss(logprobs, behaviour, advantages, mask, 11.0).loss
        (step_grad,) = torch.autograd.grad(step, logprobs)
        cut = int(torch.randint(1, 5, (1,), generator=generator))
        micro = [
            cispo_loss(logprobs[rows], behaviour[rows], advantages[rows], mask[rows], 11.0).loss
            for rows in (slice(0, cut), slice(cut, 5))
        ]
        (micro_grad,) = torch.autograd.grad(sum(micro), logprobs)
        assert sum(loss.item() for loss in micro) == pytest.approx(step.item(), rel=1e-12, abs=1e-15)
        torch.testing.assert_close(micro_grad, step_grad)


@pytest.mark.parametrize("clip_high", [1e9, 0.28, 1.0])
def test_no_lower_bound_is_truncated_is_with_cap_one_plus_clip_high(clip_high: float) -> None:
    # clip_high = 1e9 is "huge clip equals truncated IS with a huge cap"; the others the general identity.
    generator = torch.Generator().manual_seed(3)
    for _ in range(30):
        logprobs, behaviour, advantages, mask = _random_batch(generator, spread=1.0)
        logprobs.requires_grad_()
        cispo = cispo_loss(logprobs, behaviour, advantages, mask, 4.0, clip_high=clip_high)
        truncated = truncated_is_loss(logprobs, behaviour, advantages, mask, 4, is_cap=1.0 + clip_high)
        (cispo_grad,) = torch.autograd.grad(cispo.loss, logprobs)
        (truncated_grad,) = torch.autograd.grad(truncated.loss, logprobs)
        assert cispo.loss.item() == pytest.approx(truncated.loss.item(), rel=1e-12, abs=1e-15)
        torch.testing.assert_close(cispo_grad, truncated_grad, rtol=1e-12, atol=0)
        torch.testing.assert_close(cispo.importance_weights, truncated.importance_weights, rtol=0, atol=0)
        assert cispo.clipped_fraction == truncated.clipped_fraction


def test_all_tokens_masked_out_gives_zero_loss_and_fractions() -> None:
    logprobs = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    output = cispo_loss(
        logprobs, torch.ones(2, 3), torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool), 1.0
    )
    output.loss.backward()
    assert output.loss.item() == 0.0
    assert logprobs.grad is not None
    assert logprobs.grad.abs().sum().item() == 0.0
    assert (output.clipped_fraction, output.clipped_low_fraction, output.clipped_high_fraction) == (0, 0, 0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"behaviour_logprobs": torch.zeros(3)}, r"behaviour_logprobs has shape \(3,\), expected the shape"),
        ({"token_mask": torch.ones(4, dtype=torch.int64)}, "token_mask must be a bool tensor, got dtype"),
        ({"logprobs": torch.zeros(4, dtype=torch.int64)}, "logprobs must be a floating-point tensor"),
        ({"denominator": -1.0}, "denominator must be a finite number > 0 .*, got -1.0"),
        ({"denominator": math.inf}, "denominator must be a finite number > 0 .*, got inf"),
        ({"clip_low": -0.2}, "clip_low must be a finite number >= 0, got -0.2"),
        ({"clip_high": math.nan}, "clip_high must be a finite number >= 0, got nan"),
    ],
)
def test_rejects_bad_inputs(overrides: dict, message: str) -> None:
    arguments: dict = {
        "logprobs": torch.zeros(4),
        "behaviour_logprobs": torch.zeros(4),
        "advantages": torch.zeros(4),
        "token_mask": torch.ones(4, dtype=torch.bool),
        "denominator": 1.0,
    }
    arguments.update(overrides)
    with pytest.raises(ValueError, match=message):
        cispo_loss(**arguments)
