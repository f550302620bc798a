"""Token lag and its statistics, checked against hand values and a numpy recomputation."""

import json

import numpy as np
import pytest
import torch

from pipelinerl.rl.lag import lag_statistics, token_lags


def test_token_lags_subtracts_versions() -> None:
    lags = token_lags(5, torch.tensor([[5, 4], [2, 0]], dtype=torch.int32))
    assert lags.dtype == torch.int64
    assert lags.tolist() == [[0, 1], [3, 5]]


def test_token_lags_rejects_tokens_from_the_future() -> None:
    with pytest.raises(ValueError, match="policy version 6, newer than the trainer's version 5"):
        token_lags(5, torch.tensor([3, 6, 5]))


def test_token_lags_rejects_float_versions() -> None:
    with pytest.raises(ValueError, match="integer tensor"):
        token_lags(5, torch.tensor([3.0]))


def test_small_hand_example() -> None:
    stats = lag_statistics(torch.tensor([3, 0, 2, 1]), torch.tensor([0, 1, 2, 3]), histogram_bins=8)
    assert stats.num_tokens == 4
    assert stats.mean == pytest.approx(1.5)
    assert stats.p50 == pytest.approx(1.5)
    assert stats.p90 == pytest.approx(2.7)
    assert (stats.min, stats.max) == (0, 3)
    assert stats.histogram == [1, 1, 1, 1, 0, 0, 0, 0]


def test_statistics_equal_numpy_recomputation() -> None:
    torch.manual_seed(0)
    for num_tokens in (1, 2, 5, 1000, 4099):
        lags = torch.randint(0, 40, (num_tokens,))
        positions = torch.randint(0, 300, (num_tokens,))
        stats = lag_statistics(lags, positions, histogram_bins=16, position_bucket_size=8)
        lags_np, positions_np = lags.numpy(), positions.numpy()

        assert stats.mean == pytest.approx(float(lags_np.mean()), rel=1e-12)
        assert stats.p50 == pytest.approx(float(np.percentile(lags_np, 50, method="linear")), rel=1e-12)
        assert stats.p90 == pytest.approx(float(np.percentile(lags_np, 90, method="linear")), rel=1e-12)
        assert stats.max == int(lags_np.max())
        assert stats.min == int(lags_np.min())
        assert stats.histogram == np.bincount(np.minimum(lags_np, 15), minlength=16).tolist()
        buckets = positions_np // 8
        assert len(stats.mean_by_position) == buckets.max() + 1
        for bucket, mean_lag in enumerate(stats.mean_by_position):
            in_bucket = lags_np[buckets == bucket]
            if in_bucket.size == 0:
                assert mean_lag is None
            else:
                assert mean_lag == pytest.approx(float(in_bucket.mean()), rel=1e-12)


def test_histogram_last_bin_counts_overflow() -> None:
    stats = lag_statistics(
        torch.tensor([0, 1, 1, 2, 5, 9]), torch.zeros(6, dtype=torch.int64), histogram_bins=3
    )
    assert stats.histogram == [1, 2, 3]


def test_position_buckets_with_an_empty_bucket() -> None:
    stats = lag_statistics(
        torch.tensor([0, 2, 4, 6, 8]), torch.tensor([0, 1, 2, 9, 10]), position_bucket_size=4
    )
    assert stats.position_bucket_size == 4
    assert stats.mean_by_position == [2.0, None, 7.0]


def test_two_dimensional_inputs_and_json_round_trip() -> None:
    lags = torch.tensor([[1, 1, 0], [4, 3, 3]])
    positions = torch.tensor([[0, 1, 2], [0, 1, 2]])
    stats = lag_statistics(lags, positions, histogram_bins=4, position_bucket_size=2)
    as_dict = stats.to_dict()
    assert json.loads(json.dumps(as_dict)) == as_dict
    assert as_dict["histogram"] == [1, 2, 0, 3]
    assert as_dict["mean_by_position"] == [pytest.approx(9 / 4), pytest.approx(1.5)]
    assert as_dict["max"] == 4


@pytest.mark.parametrize(
    ("lags", "positions", "kwargs", "message"),
    [
        (torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64), {}, "at least one token"),
        (torch.tensor([1, 2]), torch.tensor([0]), {}, "token_positions has shape"),
        (torch.tensor([1.0]), torch.tensor([0]), {}, "token_lags must be an integer tensor"),
        (torch.tensor([-1]), torch.tensor([0]), {}, "token_lags must be >= 0, got a lag of -1"),
        (torch.tensor([1]), torch.tensor([-2]), {}, "got a position of -2"),
        (torch.tensor([1]), torch.tensor([0]), {"histogram_bins": 0}, "histogram_bins must be >= 1, got 0"),
        (
            torch.tensor([1]),
            torch.tensor([0]),
            {"position_bucket_size": 0},
            "position_bucket_size must be >= 1",
        ),
    ],
)
def test_lag_statistics_rejects_bad_inputs(
    lags: torch.Tensor, positions: torch.Tensor, kwargs: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        lag_statistics(lags, positions, **kwargs)
