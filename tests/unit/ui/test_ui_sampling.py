"""Downsampling keeps the shape of a long series within a point budget."""

from __future__ import annotations

import pytest

from pipelinerl.ui.sampling import keep_indices, keep_indices_of_columns


def test_short_series_are_kept_whole() -> None:
    assert keep_indices([0.1, 0.2, 0.3], 10) == [0, 1, 2]


def test_long_series_fit_the_budget_and_keep_ends_and_spikes() -> None:
    values: list[float | None] = [0.5] * 10_000
    values[4321] = -3.0  # the one step where the reward collapsed
    values[7777] = 9.0
    kept = keep_indices(values, 100)
    assert len(kept) <= 100
    assert kept == sorted(kept) and len(set(kept)) == len(kept)
    assert kept[0] == 0 and kept[-1] == 9_999
    assert 4321 in kept and 7777 in kept


def test_missing_values_are_never_extremes_but_keep_the_axis_covered() -> None:
    values: list[float | None] = [None] * 50 + [1.0, 2.0] * 50
    kept = keep_indices(values, 20)
    assert len(kept) <= 20
    assert any(i < 50 for i in kept[1:]), "a bucket of only missing values keeps one index"


def test_columns_share_rows_and_keep_each_columns_extremes() -> None:
    reward = [0.0] * 5000
    ess = [1.0] * 5000
    reward[100] = 1.0
    ess[4000] = 0.1
    kept = keep_indices_of_columns([reward, ess], 200)
    assert len(kept) <= 200
    assert 100 in kept and 4000 in kept


def test_a_budget_below_two_points_is_refused() -> None:
    with pytest.raises(ValueError, match="max_points must be at least 2"):
        keep_indices([1.0, 2.0, 3.0], 1)
