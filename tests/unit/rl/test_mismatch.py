"""Behaviour mismatch: hand values, only lag-0 tokens count, no lag-0 token, rejected inputs."""

import numpy as np
import pytest
import torch

from pipelinerl.rl.mismatch import behaviour_mismatch


def test_hand_example_counts_only_lag_zero_tokens() -> None:
    trainer = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    behaviour = torch.tensor([-1.25, -1.0, -0.25, -9.0])
    lags = torch.tensor([0, 1, 0, 2])
    # |(-1) - (-1.25)| = 0.25 and |(-0.5) - (-0.25)| = 0.25; lags 1 and 2 (a changed policy) do not count.
    assert behaviour_mismatch(trainer, behaviour, lags) == pytest.approx(0.25)


def test_equal_logprobs_give_zero() -> None:
    logprobs = torch.tensor([-0.1, -2.0, -7.5])
    assert behaviour_mismatch(logprobs, logprobs.clone(), torch.zeros(3, dtype=torch.int64)) == 0.0


def test_no_lag_zero_token_gives_none() -> None:
    assert behaviour_mismatch(torch.zeros(3), torch.ones(3), torch.tensor([1, 2, 1])) is None
    assert behaviour_mismatch(torch.zeros(0), torch.zeros(0), torch.zeros(0, dtype=torch.int64)) is None


def test_matches_numpy_on_random_float32_data() -> None:
    generator = np.random.default_rng(0)
    trainer = generator.normal(-2.0, 1.0, 5000).astype(np.float32)
    behaviour = (trainer + generator.normal(0.0, 1e-3, 5000)).astype(np.float32)
    lags = generator.integers(0, 3, 5000)
    expected = np.abs(trainer.astype(np.float64) - behaviour)[lags == 0].mean()
    value = behaviour_mismatch(torch.from_numpy(trainer), torch.from_numpy(behaviour), torch.from_numpy(lags))
    assert value == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("trainer", "behaviour", "lags", "message"),
    [
        (torch.zeros(3), torch.zeros(2), torch.zeros(3, dtype=torch.int64), "one shape"),
        (torch.zeros(2), torch.zeros(2), torch.zeros(2), "integer tensor"),
        (torch.tensor([0.0, float("-inf")]), torch.zeros(2), torch.zeros(2, dtype=torch.int64), "non-finite"),
    ],
)
def test_rejects_bad_inputs(trainer, behaviour, lags, message) -> None:
    with pytest.raises(ValueError, match=message):
        behaviour_mismatch(trainer, behaviour, lags)
