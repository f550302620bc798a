"""Leave-one-out advantages: hand values, zero-sum groups, optional std normalisation."""

import math

import numpy as np
import pytest

from pipelinerl.rl.advantages import leave_one_out_advantages


def test_hand_example() -> None:
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]])
    advantages = leave_one_out_advantages(rewards)
    # row 0: 1 - (0+0+1)/3 = 2/3 and 0 - (1+0+1)/3 = -2/3; row 1: 3 - 5/3, 1 - 7/3, 2 - 2, 2 - 2
    expected = [[2 / 3, -2 / 3, -2 / 3, 2 / 3], [4 / 3, -4 / 3, 0.0, 0.0]]
    for row, expected_row in zip(advantages.tolist(), expected, strict=True):
        assert row == pytest.approx(expected_row, abs=1e-6)


def test_groups_sum_to_zero_and_equal_scaled_mean_baseline() -> None:
    rewards = np.random.default_rng(0).standard_normal((50, 8))
    advantages = leave_one_out_advantages(rewards)
    np.testing.assert_allclose(advantages.sum(axis=1), np.zeros(50), atol=1e-12)
    expected = 8 / 7 * (rewards - rewards.mean(axis=1, keepdims=True))
    np.testing.assert_allclose(advantages, expected, rtol=1e-12)


def test_normalize_std_divides_by_group_std() -> None:
    rewards = np.array([[1.0, 0.0, 0.0, 1.0]], dtype=np.float64)
    advantages = leave_one_out_advantages(rewards, normalize_std=True, eps=0.0)
    group_std = math.sqrt(1 / 3)  # sample std (correction=1) of [1, 0, 0, 1]
    scaled = 2 / 3 / group_std
    assert advantages[0].tolist() == pytest.approx([scaled, -scaled, -scaled, scaled], rel=1e-12)


def test_constant_group_has_zero_advantages_even_when_normalised() -> None:
    rewards = np.full((2, 4), 0.7)
    for normalize_std in (False, True):
        advantages = leave_one_out_advantages(rewards, normalize_std=normalize_std)
        assert np.abs(advantages).max() < 1e-6


def test_integer_rewards_are_promoted_to_float() -> None:
    advantages = leave_one_out_advantages(np.array([[1, 0]]))
    assert advantages.dtype == np.float32
    assert advantages.tolist() == [[1.0, -1.0]]


def test_a_list_of_rewards_is_taken_as_an_array() -> None:
    assert leave_one_out_advantages([[1.0, 0.0, 0.0]])[0].tolist() == pytest.approx([1.0, -0.5, -0.5])


def test_rejects_group_of_one_and_wrong_rank() -> None:
    with pytest.raises(ValueError, match="group_size must be >= 2.*got 1"):
        leave_one_out_advantages(np.zeros((3, 1)))
    with pytest.raises(ValueError, match=r"got shape \(4,\)"):
        leave_one_out_advantages(np.zeros(4))
