"""KL estimators: hand-computed values and gradients, exact expectations, non-negativity, masking."""

import math

import pytest
import torch

from pipelinerl.rl.kl import KL_ESTIMATORS, kl_mean, kl_penalty

ESTIMATORS = ["k1", "k2", "k3"]


def _hand_example() -> dict[str, torch.Tensor]:
    # x = log pi - log ref = [0.5, -1.0, masked] in row 0, [0, 2, masked] in row 1
    return {
        "logprobs": torch.tensor(
            [[-1.0, -2.0, 5.0], [-0.3, -0.1, -0.2]], dtype=torch.float64
        ).requires_grad_(),
        "reference_logprobs": torch.tensor(
            [[-1.5, -1.0, float("-inf")], [-0.3, -2.1, float("nan")]], dtype=torch.float64
        ),
        "token_mask": torch.tensor([[True, True, False], [True, True, False]]),
    }


E = math.e
# per estimator: values and d(sum)/dlogprobs at x = [[0.5, -1, -], [0, 2, -]]
HAND = {
    # k1 = x, gradient 1
    "k1": ([[0.5, -1.0, 0.0], [0.0, 2.0, 0.0]], [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]),
    # k2 = x^2 / 2, gradient x
    "k2": ([[0.125, 0.5, 0.0], [0.0, 2.0, 0.0]], [[0.5, -1.0, 0.0], [0.0, 2.0, 0.0]]),
    # k3 = e^-x + x - 1, gradient 1 - e^-x
    "k3": (
        [[math.exp(-0.5) - 0.5, E - 2.0, 0.0], [0.0, math.exp(-2.0) + 1.0, 0.0]],
        [[1 - math.exp(-0.5), 1 - E, 0.0], [0.0, 1 - math.exp(-2.0), 0.0]],
    ),
}


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_hand_example_values_and_gradients(estimator) -> None:
    inputs = _hand_example()
    values = kl_penalty(**inputs, estimator=estimator)
    expected_values, expected_grad = HAND[estimator]
    torch.testing.assert_close(values.detach(), torch.tensor(expected_values, dtype=torch.float64))
    values.sum().backward()
    assert inputs["logprobs"].grad is not None
    torch.testing.assert_close(inputs["logprobs"].grad, torch.tensor(expected_grad, dtype=torch.float64))


def test_kl_mean_of_the_hand_example() -> None:
    inputs = _hand_example()
    values = kl_penalty(**inputs, estimator="k3")
    expected = (math.exp(-0.5) - 0.5 + E - 2.0 + 0.0 + math.exp(-2.0) + 1.0) / 4
    assert kl_mean(values, inputs["token_mask"]) == pytest.approx(expected, rel=1e-12)
    assert kl_mean(kl_penalty(**inputs, estimator="k1"), inputs["token_mask"]) == pytest.approx(1.5 / 4)


def test_kl_mean_ignores_masked_values_and_is_zero_without_tokens() -> None:
    values = torch.tensor([1.0, float("nan"), 3.0])
    assert kl_mean(values, torch.tensor([True, False, True])) == 2.0
    assert kl_mean(values, torch.zeros(3, dtype=torch.bool)) == 0.0


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_every_estimator_is_zero_with_zero_gradient_when_the_policies_match(estimator) -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        logprobs = (-torch.rand(3, 5, generator=generator, dtype=torch.float64) * 4).requires_grad_()
        mask = torch.rand(3, 5, generator=generator) > 0.3
        values = kl_penalty(logprobs, logprobs.detach().clone(), mask, estimator)
        (grad,) = torch.autograd.grad(values.sum(), logprobs)
        assert values.abs().max().item() == 0.0
        if estimator != "k1":  # k1's gradient is 1 everywhere: the gradient of the *estimate*, not the KL
            assert grad.abs().max().item() == 0.0


def test_k2_and_k3_are_non_negative_over_random_trials() -> None:
    generator = torch.Generator().manual_seed(1)
    for _ in range(100):
        scale = 10 ** float(torch.empty(1).uniform_(-8, 1, generator=generator))
        logprobs = -torch.rand(4, 7, generator=generator, dtype=torch.float64) * 5
        reference = logprobs + scale * torch.randn(4, 7, generator=generator, dtype=torch.float64)
        mask = torch.rand(4, 7, generator=generator) > 0.2
        for estimator in ("k2", "k3"):
            assert (kl_penalty(logprobs, reference, mask, estimator) >= 0).all()


def test_k1_and_k3_are_unbiased_and_k2_is_not_exactly_over_random_distributions() -> None:
    # E_{y ~ pi}[k(y)] computed exactly over a vocabulary: k1 and k3 give KL(pi || ref), k2 does not.
    generator = torch.Generator().manual_seed(2)
    for _ in range(30):
        log_pi = torch.log_softmax(torch.randn(9, generator=generator, dtype=torch.float64), dim=0)
        log_ref = torch.log_softmax(torch.randn(9, generator=generator, dtype=torch.float64), dim=0)
        mask = torch.ones(9, dtype=torch.bool)
        pi = log_pi.exp()
        true_kl = (pi * (log_pi - log_ref)).sum().item()
        for estimator in ("k1", "k3"):
            expectation = (pi * kl_penalty(log_pi, log_ref, mask, estimator)).sum().item()
            assert expectation == pytest.approx(true_kl, rel=1e-10)
        k2 = (pi * kl_penalty(log_pi, log_ref, mask, "k2")).sum().item()
        assert k2 != pytest.approx(true_kl, rel=1e-6)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_masked_positions_never_change_values_or_gradient(estimator) -> None:
    generator = torch.Generator().manual_seed(3)
    for _ in range(30):
        logprobs = -torch.rand(3, 5, generator=generator, dtype=torch.float64) * 3
        reference = logprobs + torch.randn(3, 5, generator=generator, dtype=torch.float64)
        mask = torch.rand(3, 5, generator=generator) > 0.4
        results = []
        for noisy in (False, True):
            lp, ref = logprobs, reference
            if noisy:
                lp = torch.where(
                    mask, logprobs, 1e4 * torch.randn(3, 5, generator=generator, dtype=torch.float64)
                )
                ref = torch.where(mask, reference, torch.full_like(reference, float("-inf")))
            leaf = lp.clone().requires_grad_()
            values = kl_penalty(leaf, ref, mask, estimator)
            (grad,) = torch.autograd.grad(values.sum(), leaf)
            results.append((values.detach(), grad))
        torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
        torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=0)
        assert (results[1][0][~mask] == 0).all()


def test_reference_gets_no_gradient() -> None:
    logprobs = torch.tensor([-1.0, -2.0], dtype=torch.float64, requires_grad=True)
    reference = torch.tensor([-1.5, -1.0], dtype=torch.float64, requires_grad=True)
    kl_penalty(logprobs, reference, torch.ones(2, dtype=torch.bool), "k3").sum().backward()
    assert reference.grad is None


def test_float32_input_keeps_float32() -> None:
    values = kl_penalty(torch.zeros(3), torch.zeros(3), torch.ones(3, dtype=torch.bool), "k2")
    assert values.dtype == torch.float32


def test_the_valid_estimators_are_exported() -> None:
    assert KL_ESTIMATORS == ("k1", "k2", "k3")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"estimator": "k4"}, r"unknown KL estimator 'k4'; valid: k1, k2, k3"),
        ({"reference_logprobs": torch.zeros(2)}, r"reference_logprobs has shape \(2,\), expected the shape"),
        ({"token_mask": torch.ones(2, dtype=torch.bool)}, r"token_mask has shape \(2,\), expected the shape"),
        ({"token_mask": torch.ones(3)}, "token_mask must be a bool tensor, got dtype torch.float32"),
        (
            {"logprobs": torch.zeros(3, dtype=torch.int64)},
            "logprobs must be a floating-point tensor, got dtype torch.int64",
        ),
    ],
)
def test_kl_penalty_rejects_bad_inputs(overrides: dict, message: str) -> None:
    arguments: dict = {
        "logprobs": torch.zeros(3),
        "reference_logprobs": torch.zeros(3),
        "token_mask": torch.ones(3, dtype=torch.bool),
        "estimator": "k3",
    }
    arguments.update(overrides)
    with pytest.raises(ValueError, match=message):
        kl_penalty(**arguments)


def test_kl_mean_rejects_bad_masks() -> None:
    with pytest.raises(ValueError, match=r"token_mask has shape \(2,\), expected the shape of values \(3,\)"):
        kl_mean(torch.zeros(3), torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="token_mask must be a bool tensor"):
        kl_mean(torch.zeros(3), torch.ones(3))
