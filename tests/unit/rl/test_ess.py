"""Effective sample size: hand values, bounds over random weights, masking and rejected inputs."""

import pytest
import torch

from pipelinerl.rl.ess import effective_sample_size


def test_equal_weights_give_one() -> None:
    assert effective_sample_size(torch.full((7, 13), 0.37)) == pytest.approx(1.0, abs=1e-15)


def test_hand_example_and_mask() -> None:
    # (1 + 3)^2 / (2 * (1 + 9)) = 0.8; the masked-out 100 must not count
    assert effective_sample_size(torch.tensor([1.0, 3.0])) == pytest.approx(0.8)
    weights = torch.tensor([[1.0, 100.0], [3.0, 100.0]])
    mask = torch.tensor([[True, False], [True, False]])
    assert effective_sample_size(weights, mask) == pytest.approx(0.8)


def test_one_nonzero_weight_among_n_gives_one_over_n() -> None:
    assert effective_sample_size(torch.tensor([2.0, 0.0, 0.0, 0.0])) == pytest.approx(0.25)


def test_random_weights_lie_in_unit_interval_and_are_scale_invariant() -> None:
    torch.manual_seed(0)
    for _ in range(200):
        weights = torch.exp(2.0 * torch.randn(int(torch.randint(1, 500, ()).item())))
        ess = effective_sample_size(weights)
        assert 0.0 < ess <= 1.0
        assert effective_sample_size(weights * 3.5) == pytest.approx(ess, rel=1e-6)


@pytest.mark.parametrize(
    ("weights", "mask", "message"),
    [
        (torch.ones(3), torch.zeros(3, dtype=torch.bool), "at least one masked-in token, got 0"),
        (torch.tensor([1.0, -0.5]), None, "non-negative, got a weight of -0.5"),
        (torch.zeros(4), None, "all importance_weights are 0"),
        (torch.tensor([1.0, float("inf")]), None, "non-finite"),
        (torch.ones(3), torch.ones(4, dtype=torch.bool), "token_mask has shape"),
        (torch.ones(3), torch.ones(3), "bool"),
    ],
)
def test_rejects_bad_inputs(weights: torch.Tensor, mask: torch.Tensor | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        effective_sample_size(weights, mask)
