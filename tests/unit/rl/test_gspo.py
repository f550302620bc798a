"""GSPO: hand-computed sequence ratios, loss, gradients and fractions; masking, micro-batches, reductions."""

import math

import pytest
import torch

from pipelinerl.rl.gspo import gspo_loss
from pipelinerl.rl.loss import ppo_clip_loss


def _hand_example() -> dict[str, torch.Tensor]:
    # Row 0: two tokens, log ratios 0.2 and -0.1 (mean 0.05), the third masked out (log ratio 50, garbage).
    # Row 1: three tokens, log ratios -0.3, 0, -0.3 (mean -0.2). Row 2: one token, log ratio -0.5.
    logprobs = torch.tensor([[-0.5, -1.0, -2.0], [-0.2, -0.7, -1.1], [-0.9, 3.0, 7.0]], dtype=torch.float64)
    log_ratios = torch.tensor(
        [[0.2, -0.1, 50.0], [-0.3, 0.0, -0.3], [-0.5, -80.0, 90.0]], dtype=torch.float64
    )
    return {
        "logprobs": logprobs.clone().requires_grad_(),
        "behaviour_logprobs": logprobs - log_ratios,
        "advantages": torch.tensor(
            [[1.0, 1.0, float("nan")], [2.0, 2.0, 2.0], [-1.0, 5.0, 5.0]], dtype=torch.float64
        ),
        "token_mask": torch.tensor([[True, True, False], [True, True, True], [True, False, False]]),
    }


def test_hand_example_value_ratios_and_fractions() -> None:
    inputs = _hand_example()
    output = gspo_loss(**inputs, denominator=4.0, clip_low=0.1, clip_high=0.04)

    # range [0.9, 1.04]; s = [e^0.05 = 1.0513, e^-0.2 = 0.8187, e^-0.5 = 0.6065]
    # row 0 (A=+1): min(1.0513, 1.04) = 1.04, clipped high
    # row 1 (A=+2): min(1.6375, 0.9 * 2 = 1.8) = 2 e^-0.2, unclipped (its ratio is below 0.9, but A > 0)
    # row 2 (A=-1): min(-0.6065, -0.9) = -0.9, clipped low
    expected = -(1.04 + 2 * math.exp(-0.2) - 0.9) / 4
    assert output.loss.item() == pytest.approx(expected, rel=1e-12)
    s0, s1, s2 = math.exp(0.05), math.exp(-0.2), math.exp(-0.5)
    expected_ratio = [[s0, s0, 0.0], [s1, s1, s1], [s2, 0.0, 0.0]]
    for got, want in zip(output.ratio.tolist(), expected_ratio, strict=True):
        assert got == pytest.approx(want, rel=1e-12)
    assert output.importance_weights.tolist() == output.ratio.tolist()
    assert not output.ratio.requires_grad
    # 6 masked-in tokens: row 0's two are clipped high, row 2's one clipped low
    assert output.clipped_fraction == pytest.approx(3 / 6)
    assert output.clipped_high_fraction == pytest.approx(2 / 6)
    assert output.clipped_low_fraction == pytest.approx(1 / 6)


def test_hand_example_gradient() -> None:
    inputs = _hand_example()
    gspo_loss(**inputs, denominator=4.0, clip_low=0.1, clip_high=0.04).loss.backward()
    # Only row 1 is unclipped: d(s A)/dlogprob_t = s A / n for each of its n = 3 tokens, so the gradient is
    # -2 e^-0.2 / (3 * 4) = -e^-0.2 / 6 at each; rows 0 and 2 are clipped (0), masked positions 0.
    grad = inputs["logprobs"].grad
    assert grad is not None
    g = -math.exp(-0.2) / 6
    assert grad.tolist()[0] == [0.0, 0.0, 0.0]
    assert grad.tolist()[1] == pytest.approx([g, g, g], rel=1e-12)
    assert grad.tolist()[2] == [0.0, 0.0, 0.0]


def test_unclipped_gradient_is_the_sequence_ratio_times_advantage_over_length() -> None:
    inputs = _hand_example()
    # a range wide enough that nothing clips
    gspo_loss(**inputs, denominator=4.0, clip_low=0.9, clip_high=10.0).loss.backward()
    s0, s1, s2 = math.exp(0.05), math.exp(-0.2), math.exp(-0.5)
    expected = [
        [-s0 * 1 / (2 * 4), -s0 * 1 / (2 * 4), 0.0],
        [-s1 * 2 / (3 * 4)] * 3,
        [-s2 * -1 / (1 * 4), 0.0, 0.0],
    ]
    grad = inputs["logprobs"].grad
    assert grad is not None
    for got, want in zip(grad.tolist(), expected, strict=True):
        assert got == pytest.approx(want, rel=1e-12)


def test_a_row_without_tokens_contributes_nothing() -> None:
    logprobs = torch.tensor([[-0.5, -1.0], [float("nan"), float("inf")]], dtype=torch.float64)
    logprobs.requires_grad_()
    behaviour = torch.tensor([[-0.5, -1.0], [float("-inf"), 3.0]], dtype=torch.float64)
    advantages = torch.tensor([[1.5, 1.5], [float("nan"), 9.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [False, False]])
    output = gspo_loss(logprobs, behaviour, advantages, mask, denominator=2.0)
    output.loss.backward()
    # row 0 on policy: s = 1, term 1.5; row 1 nothing
    assert output.loss.item() == pytest.approx(-1.5 / 2, rel=1e-12)
    assert logprobs.grad is not None
    expected_grad = torch.tensor([[-1.5 / 4, -1.5 / 4], [0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logprobs.grad, expected_grad, rtol=1e-12, atol=0)
    assert output.ratio.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert output.clipped_fraction == 0.0


def test_all_rows_empty_gives_zero_loss_gradient_and_fractions() -> None:
    logprobs = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    output = gspo_loss(logprobs, torch.ones(2, 3, dtype=torch.float64), torch.ones(2, 3), mask, 1.0)
    output.loss.backward()
    assert output.loss.item() == 0.0
    assert logprobs.grad is not None
    assert logprobs.grad.abs().sum().item() == 0.0
    assert (output.clipped_fraction, output.clipped_low_fraction, output.clipped_high_fraction) == (0, 0, 0)


def _random_batch(generator: torch.Generator, rows: int = 4, cols: int = 6, spread: float = 0.05):
    logprobs = -torch.rand(rows, cols, generator=generator, dtype=torch.float64) * 3
    behaviour = logprobs + spread * torch.randn(rows, cols, generator=generator, dtype=torch.float64)
    advantages = (
        torch.randn(rows, 1, generator=generator, dtype=torch.float64).expand(rows, cols).contiguous()
    )
    mask = torch.rand(rows, cols, generator=generator) > 0.3
    return logprobs, behaviour, advantages, mask


def test_masked_positions_never_change_loss_or_gradient_over_random_trials() -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        logprobs, behaviour, advantages, mask = _random_batch(generator)
        garbage = 1e3 * torch.randn(3, *mask.shape, generator=generator, dtype=torch.float64)
        results = []
        for noisy in (False, True):
            parts = [logprobs, behaviour, advantages]
            if noisy:
                parts = [torch.where(mask, part, garbage[i]) for i, part in enumerate(parts)]
            leaf = parts[0].clone().requires_grad_()
            output = gspo_loss(leaf, parts[1], parts[2], mask, 4.0, clip_low=0.02, clip_high=0.03)
            (grad,) = torch.autograd.grad(output.loss, leaf)
            results.append((output.loss.detach(), grad, output.ratio, output.clipped_fraction))
        for clean, noisy_result in zip(results[0], results[1], strict=True):
            if isinstance(clean, torch.Tensor):
                torch.testing.assert_close(clean, noisy_result, rtol=0, atol=0)
            else:
                assert clean == noisy_result


def test_micro_batches_sum_to_the_step_over_random_trials() -> None:
    generator = torch.Generator().manual_seed(1)
    for _ in range(50):
        logprobs, behaviour, advantages, mask = _random_batch(generator, rows=5)
        logprobs.requires_grad_()
        step = gspo_loss(logprobs, behaviour, advantages, mask, 7.0, clip_low=0.02, clip_high=0.03).loss
        (step_grad,) = torch.autograd.grad(step, logprobs)
        cut = int(torch.randint(1, 5, (1,), generator=generator))
        micro = [
            gspo_loss(logprobs[rows], behaviour[rows], advantages[rows], mask[rows], 7.0, 0.02, 0.03).loss
            for rows in (slice(0, cut), slice(cut, 5))
        ]
        (micro_grad,) = torch.autograd.grad(sum(micro), logprobs)
        assert sum(loss.item() for loss in micro) == pytest.approx(step.item(), rel=1e-12, abs=1e-15)
        torch.testing.assert_close(micro_grad, step_grad)


def test_zero_clip_range_on_policy_is_sequence_level_reinforce_over_random_trials() -> None:
    generator = torch.Generator().manual_seed(2)
    for _ in range(50):
        logprobs, _, advantages, mask = _random_batch(generator)
        logprobs.requires_grad_()
        output = gspo_loss(
            logprobs, logprobs.detach().clone(), advantages, mask, 3.0, clip_low=0.0, clip_high=0.0
        )
        (grad,) = torch.autograd.grad(output.loss, logprobs)

        # REINFORCE on the length-normalised sequence log-probability: -(1/3) sum_i A_i mean_t log pi_it
        counts = mask.sum(dim=1).clamp(min=1)
        sequence_logprob = torch.where(mask, logprobs, torch.zeros_like(logprobs)).sum(dim=1) / counts
        reinforce = -(advantages[:, 0] * sequence_logprob * (mask.sum(dim=1) > 0)).sum() / 3.0
        (expected_grad,) = torch.autograd.grad(reinforce, logprobs)
        on_policy_value = -(advantages[:, 0] * (mask.sum(dim=1) > 0)).sum().item() / 3.0
        assert output.loss.item() == pytest.approx(on_policy_value, rel=1e-12, abs=1e-15)
        torch.testing.assert_close(grad, expected_grad)
        assert output.clipped_fraction == 0.0


def test_one_token_rows_are_ppo_with_the_same_range() -> None:
    # With one token per sequence, the sequence ratio is the token ratio: GSPO is PPO-clip.
    generator = torch.Generator().manual_seed(4)
    logprobs, behaviour, advantages, _ = _random_batch(generator, rows=8, cols=1, spread=0.5)
    mask = torch.ones(8, 1, dtype=torch.bool)
    gspo = gspo_loss(logprobs, behaviour, advantages, mask, 8.0, clip_low=0.2, clip_high=0.28)
    ppo = ppo_clip_loss(logprobs, behaviour, advantages, mask, 8, clip_low=0.2, clip_high=0.28)
    assert ppo.clipped_fraction > 0, "the example must exercise the clip"
    assert gspo.loss.item() == pytest.approx(ppo.loss.item(), rel=1e-12)
    assert gspo.clipped_low_fraction == ppo.clipped_low_fraction
    assert gspo.clipped_high_fraction == ppo.clipped_high_fraction


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"advantages": torch.zeros(2, 2)}, r"advantages has shape \(2, 2\), expected the shape of logprobs"),
        ({"token_mask": torch.ones(2, 3)}, "token_mask must be a bool tensor"),
        ({"denominator": 0.0}, "denominator must be a finite number > 0 .*, got 0.0"),
        ({"denominator": math.nan}, "denominator must be a finite number > 0 .*, got nan"),
        ({"clip_low": -0.1}, "clip_low must be a finite number >= 0, got -0.1"),
        ({"clip_high": math.inf}, "clip_high must be a finite number >= 0, got inf"),
    ],
)
def test_rejects_bad_inputs(overrides: dict, message: str) -> None:
    arguments: dict = {
        "logprobs": torch.zeros(2, 3),
        "behaviour_logprobs": torch.zeros(2, 3),
        "advantages": torch.zeros(2, 3),
        "token_mask": torch.ones(2, 3, dtype=torch.bool),
        "denominator": 1.0,
    }
    arguments.update(overrides)
    with pytest.raises(ValueError, match=message):
        gspo_loss(**arguments)


def test_rejects_flat_tensors() -> None:
    flat = torch.zeros(4)
    with pytest.raises(ValueError, match=r"gspo_loss needs \[batch, seq\] tensors .*got shape \(4,\)"):
        gspo_loss(flat, flat, flat, torch.ones(4, dtype=torch.bool), 1.0)
