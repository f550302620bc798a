"""Leave-one-out advantages: hand values, zero-sum groups, optional std normalisation."""

import math

import pytest
import torch

from pipelinerl.rl.advantages import leave_one_out_advantages


def test_hand_example() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]])
    advantages = leave_one_out_advantages(rewards)
    # row 0: 1 - (0+0+1)/3 = 2/3 and 0 - (1+0+1)/3 = -2/3; row 1: 3 - 5/3, 1 - 7/3, 2 - 2, 2 - 2
    expected = [[2 / 3, -2 / 3, -2 / 3, 2 / 3], [4 / 3, -4 / 3, 0.0, 0.0]]
    for row, expected_row in zip(advantages.tolist(), expected, strict=True):
        assert row == pytest.approx(expected_row, abs=1e-6)


def test_groups_sum_to_zero_and_equal_scaled_mean_baseline() -> None:
    torch.manual_seed(0)
    rewards = torch.randn(50, 8, dtype=torch.float64)
    advantages = leave_one_out_advantages(rewards)
    torch.testing.assert_close(advantages.sum(dim=1), torch.zeros(50, dtype=torch.float64))
    torch.testing.assert_close(advantages, 8 / 7 * (rewards - rewards.mean(dim=1, keepdim=True)))


def test_normalize_std_divides_by_group_std() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    advantages = leave_one_out_advantages(rewards, normalize_std=True, eps=0.0)
    group_std = math.sqrt(1 / 3)  # sample std (correction=1) of [1, 0, 0, 1]
    scaled = 2 / 3 / group_std
    assert advantages[0].tolist() == pytest.approx([scaled, -scaled, -scaled, scaled], rel=1e-12)


def test_constant_group_has_zero_advantages_even_when_normalised() -> None:
    rewards = torch.full((2, 4), 0.7)
    for normalize_std in (False, True):
        advantages = leave_one_out_advantages(rewards, normalize_std=normalize_std)
        assert advantages.abs().max().item() < 1e-6


def test_integer_rewards_are_promoted_to_float() -> None:
    advantages = leave_one_out_advantages(torch.tensor([[1, 0]]))
    assert advantages.dtype == torch.float32
    assert advantages.tolist() == [[1.0, -1.0]]


def test_rejects_group_of_one_and_wrong_rank() -> None:
    with pytest.raises(ValueError, match="group_size must be >= 2.*got 1"):
        leave_one_out_advantages(torch.zeros(3, 1))
    with pytest.raises(ValueError, match=r"got shape \(4,\)"):
        leave_one_out_advantages(torch.zeros(4))
