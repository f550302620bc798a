"""Effective sample size: hand values, bounds over random weights, masking, rejected inputs, and weights
far beyond float range (computed in log space)."""

import math

import numpy as np
import pytest
import torch

from pipelinerl.rl.ess import effective_sample_size, effective_sample_size_from_log_weights
from pipelinerl.workers.step_statistics import ess_metrics


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
        (torch.tensor([1.0, float("nan")]), None, "NaN"),
        (torch.ones(3), torch.ones(4, dtype=torch.bool), "token_mask has shape"),
        (torch.ones(3), torch.ones(3), "bool"),
    ],
)
def test_rejects_bad_inputs(weights: torch.Tensor, mask: torch.Tensor | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        effective_sample_size(weights, mask)


def test_a_huge_weight_does_not_overflow_its_square() -> None:
    # float32 squares overflow past 1.8e19 and float64 ones past 1.3e154; the ESS stays exact.
    for huge in (1e20, 1e38):
        weights = torch.tensor([huge, huge / 2, 0.0], dtype=torch.float32)
        assert effective_sample_size(weights) == pytest.approx(1.5**2 / (3 * 1.25), rel=1e-6)
    weights = torch.tensor([1e200, 3e200], dtype=torch.float64)
    assert effective_sample_size(weights) == pytest.approx(0.8)


def test_an_infinite_weight_gives_the_limit_k_over_n() -> None:
    # exp(100) overflows float32: the ratio the trainer computes is inf
    ratio = torch.exp(torch.tensor([100.0, 0.0, -3.0, 100.0], dtype=torch.float32))
    assert bool(torch.isinf(ratio[0]))
    assert effective_sample_size(ratio) == pytest.approx(2 / 4)


def test_log_weights_give_the_ess_of_their_exponentials() -> None:
    torch.manual_seed(1)
    logs = 3.0 * torch.randn(300, dtype=torch.float64)
    assert effective_sample_size_from_log_weights(logs) == pytest.approx(effective_sample_size(logs.exp()))
    # log ratios that no float can exponentiate: only the relative sizes matter
    assert effective_sample_size_from_log_weights(logs + 5000.0) == pytest.approx(
        effective_sample_size(logs.exp()), rel=1e-9
    )
    assert effective_sample_size_from_log_weights(torch.tensor([0.0, math.log(3.0), -math.inf])) == (
        pytest.approx((1 + 3) ** 2 / (3 * (1 + 9)))
    )
    mask = torch.tensor([True, True, False])
    assert effective_sample_size_from_log_weights(torch.tensor([0.0, math.log(3.0), math.nan]), mask) == (
        pytest.approx(0.8)
    )


@pytest.mark.parametrize(
    ("log_weights", "message"),
    [
        (torch.tensor([0.0, math.nan]), "NaN"),
        (torch.tensor([-math.inf, -math.inf]), "all importance_weights are 0"),
        (torch.tensor([]), "at least one masked-in token"),
    ],
)
def test_log_weights_reject_undefined_inputs(log_weights: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        effective_sample_size_from_log_weights(log_weights)


def test_the_trainer_logs_the_ess_of_raw_ratios_and_of_truncated_weights_by_name() -> None:
    # log ratios 0.5, 0 and 150 (exp(150) overflows float32: the old ratio-based ESS raised on it)
    trainer = np.array([0.0, -1.0, 50.0], dtype=np.float32)
    behaviour = np.array([-0.5, -1.0, -100.0], dtype=np.float32)
    metrics = ess_metrics(trainer, behaviour, is_cap=5.0)
    assert metrics["rl/ess"] == pytest.approx(1 / 3, rel=1e-9)  # one weight dominates the raw ratios
    truncated = np.array([math.exp(0.5), 1.0, 5.0])
    assert metrics["rl/ess_truncated"] == pytest.approx(truncated.sum() ** 2 / (3 * (truncated**2).sum()))
    assert set(ess_metrics(trainer, behaviour, is_cap=None)) == {"rl/ess"}  # PPO: no truncated weights
    # undefined (NaN log-prob): left out, not fatal
    assert ess_metrics(np.array([np.nan], dtype=np.float32), np.array([-1.0], dtype=np.float32), 5.0) == {}
