"""Token entropy and the entropy bonus: hand-computed values and gradients, bounds, stability, masking."""

import math

import pytest
import torch

from pipelinerl.rl.entropy import entropy_bonus, token_entropy

# p = [1/4, 3/4]: H = -(1/4 ln 1/4 + 3/4 ln 3/4)
H_QUARTER = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))


def _hand_logits() -> tuple[torch.Tensor, torch.Tensor]:
    # [2, 2, V=2]: (0,0) p = [1/4, 3/4]; (0,1) masked garbage; (1,0) uniform; (1,1) one token ruled out (-inf)
    logits = torch.tensor(
        [[[0.0, math.log(3.0)], [float("inf"), float("nan")]], [[5.0, 5.0], [1000.0, float("-inf")]]],
        dtype=torch.float64,
    )
    return logits.requires_grad_(), torch.tensor([[True, False], [True, True]])


def test_hand_example_values() -> None:
    logits, mask = _hand_logits()
    entropy = token_entropy(logits, mask)
    assert entropy.shape == (2, 2)
    expected = torch.tensor([[H_QUARTER, 0.0], [math.log(2.0), 0.0]], dtype=torch.float64)
    torch.testing.assert_close(entropy.detach(), expected, rtol=1e-12, atol=1e-15)


def test_hand_example_gradient() -> None:
    logits, mask = _hand_logits()
    token_entropy(logits, mask).sum().backward()
    # dH/dz_v = -p_v (ln p_v + H): at p = [1/4, 3/4] that is [-(ln 1/4 + H)/4, -3(ln 3/4 + H)/4] (sum 0);
    # uniform p is the maximum (gradient 0); the masked position and the one-hot one get 0.
    g0 = -0.25 * (math.log(0.25) + H_QUARTER)
    g1 = -0.75 * (math.log(0.75) + H_QUARTER)
    assert g0 == pytest.approx(-g1)
    expected = torch.tensor([[[g0, g1], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]], dtype=torch.float64)
    assert logits.grad is not None
    torch.testing.assert_close(logits.grad, expected, rtol=1e-12, atol=1e-15)


def test_hand_example_bonus() -> None:
    logits, mask = _hand_logits()
    bonus = entropy_bonus(token_entropy(logits, mask), mask, coef=0.1, denominator=3.0)
    assert bonus.item() == pytest.approx(-0.1 * (H_QUARTER + math.log(2.0)) / 3.0, rel=1e-12)
    bonus.backward()
    # the bonus's gradient is -coef / denominator times the entropy's
    g0 = -0.25 * (math.log(0.25) + H_QUARTER)
    assert logits.grad is not None
    assert logits.grad[0, 0, 0].item() == pytest.approx(-0.1 / 3.0 * g0, rel=1e-12)


def test_uniform_logits_give_log_v_over_random_trials() -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        vocab = int(torch.randint(1, 200, (1,), generator=generator))
        offsets = 100 * torch.randn(2, 3, 1, generator=generator, dtype=torch.float64)
        logits = offsets.expand(2, 3, vocab)
        entropy = token_entropy(logits, torch.ones(2, 3, dtype=torch.bool))
        torch.testing.assert_close(entropy, torch.full((2, 3), math.log(vocab), dtype=torch.float64))


def test_entropy_lies_between_zero_and_log_v_and_gradient_is_analytic_over_random_trials() -> None:
    generator = torch.Generator().manual_seed(1)
    for _ in range(50):
        vocab = int(torch.randint(2, 50, (1,), generator=generator))
        scale = float(torch.empty(1).uniform_(0.1, 30.0, generator=generator))
        logits = (scale * torch.randn(3, 4, vocab, generator=generator, dtype=torch.float64)).requires_grad_()
        mask = torch.rand(3, 4, generator=generator) > 0.3
        entropy = token_entropy(logits, mask)
        assert (entropy >= 0).all() and (entropy <= math.log(vocab) + 1e-12).all()
        (grad,) = torch.autograd.grad(entropy.sum(), logits)
        log_p = torch.log_softmax(logits.detach(), dim=-1)
        expected = -log_p.exp() * (log_p + entropy.detach().unsqueeze(-1))
        expected = torch.where(mask.unsqueeze(-1), expected, torch.zeros_like(expected))
        torch.testing.assert_close(grad, expected)


def test_large_logits_are_stable() -> None:
    # softmax of [1e4, 1e4 + ln 3] is [1/4, 3/4]; a naive exp would overflow
    logits = torch.tensor([[1e4, 1e4 + math.log(3.0)]], dtype=torch.float64)
    assert token_entropy(logits, torch.tensor([True])).item() == pytest.approx(H_QUARTER, rel=1e-9)
    float32 = token_entropy(torch.tensor([[3e4, 3e4]]), torch.tensor([True]))
    assert float32.dtype == torch.float32
    assert float32.item() == pytest.approx(math.log(2.0), rel=1e-6)


def test_masked_positions_never_change_entropy_or_gradient_over_random_trials() -> None:
    generator = torch.Generator().manual_seed(2)
    for _ in range(30):
        logits = torch.randn(3, 4, 6, generator=generator, dtype=torch.float64)
        mask = torch.rand(3, 4, generator=generator) > 0.4
        garbage = 1e5 * torch.randn(3, 4, 6, generator=generator, dtype=torch.float64)
        garbage[0, 0, 0] = float("nan")
        results = []
        for noisy in (False, True):
            source = torch.where(mask.unsqueeze(-1), logits, garbage) if noisy else logits
            leaf = source.clone().requires_grad_()
            bonus = entropy_bonus(token_entropy(leaf, mask), mask, 0.01, 5.0)
            (grad,) = torch.autograd.grad(bonus, leaf)
            results.append((bonus.detach(), grad))
        torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
        torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=0)


def test_bonus_of_micro_batches_sums_to_the_step() -> None:
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 4, 7, generator=generator, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(5, 4, generator=generator) > 0.3
    step = entropy_bonus(token_entropy(logits, mask), mask, 0.02, 9.0)
    micro = [
        entropy_bonus(token_entropy(logits[rows], mask[rows]), mask[rows], 0.02, 9.0)
        for rows in (slice(0, 2), slice(2, 5))
    ]
    assert sum(part.item() for part in micro) == pytest.approx(step.item(), rel=1e-12)
    (step_grad,) = torch.autograd.grad(step, logits)
    (micro_grad,) = torch.autograd.grad(sum(micro), logits)
    torch.testing.assert_close(micro_grad, step_grad)


def test_a_zero_coefficient_turns_the_bonus_off() -> None:
    entropy = torch.tensor([1.0, 2.0], requires_grad=True)
    assert entropy_bonus(entropy, torch.tensor([True, True]), 0.0, 1.0).item() == 0.0


@pytest.mark.parametrize(
    ("logits", "mask", "message"),
    [
        (
            torch.zeros(2, 3, dtype=torch.int64),
            torch.ones(2, dtype=torch.bool),
            "logits must be a floating-point",
        ),
        (
            torch.zeros(()),
            torch.ones((), dtype=torch.bool),
            r"logits must be \[\*, V\] with V >= 1, got shape \(\)",
        ),
        (
            torch.zeros(2, 0),
            torch.ones(2, dtype=torch.bool),
            r"logits must be \[\*, V\] with V >= 1, got shape",
        ),
        (
            torch.zeros(2, 3, 4),
            torch.ones(2, 4, dtype=torch.bool),
            r"token_mask has shape \(2, 4\), expected the leading shape of logits \(2, 3\)",
        ),
        (torch.zeros(2, 3, 4), torch.ones(2, 3), "token_mask must be a bool tensor, got dtype torch.float32"),
    ],
)
def test_token_entropy_rejects_bad_inputs(logits: torch.Tensor, mask: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        token_entropy(logits, mask)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"coef": -0.1}, r"coef must be a finite number >= 0 .*, got -0.1"),
        ({"coef": math.nan}, r"coef must be a finite number >= 0 .*, got nan"),
        ({"denominator": 0.0}, "denominator must be a finite number > 0, got 0.0"),
        ({"denominator": math.inf}, "denominator must be a finite number > 0, got inf"),
        ({"token_mask": torch.ones(2, dtype=torch.bool)}, r"token_mask has shape \(2,\), expected the shape"),
        ({"token_mask": torch.ones(3)}, "token_mask must be a bool tensor"),
    ],
)
def test_entropy_bonus_rejects_bad_inputs(overrides: dict, message: str) -> None:
    arguments: dict = {
        "entropy": torch.zeros(3),
        "token_mask": torch.ones(3, dtype=torch.bool),
        "coef": 0.01,
        "denominator": 1.0,
    }
    arguments.update(overrides)
    with pytest.raises(ValueError, match=message):
        entropy_bonus(**arguments)
