"""The paper's figure set and the statistics behind it, on hand-made step records."""

from __future__ import annotations

import pytest

from pipelinerl.platform.tracking.figures import early_late_lag, lag_fractions, paper_figures


def step(version: int, by_position: list[float | None], histogram: list[int], ess: float = 1.0) -> dict:
    return {
        "policy_version": version,
        "wall_s": 1.5 * version,
        "rl/reward_mean": 0.1 * version,
        "rl/ess": ess,
        "lag/by_position": by_position,
        "lag/position_bucket_size": 8,
        "lag/histogram": histogram,
    }


# PipelineRL-like: early positions older than late ones; conventional-like: one lag per sequence.
PIPELINE = [step(1, [2.0, 1.5, 1.0, 0.5], [1, 2, 1, 0, 0]), step(2, [3.0, 2.5, 1.0, None], [2, 2, 0, 0, 0])]
CONVENTIONAL = [step(1, [0.0, 0.0, 0.0, 0.0], [4, 0, 0, 0]), step(2, [1.0, 1.0, 1.0, 1.0], [0, 4, 0, 0])]


def test_early_tokens_are_older_than_late_ones_only_when_updates_land_mid_sequence():
    early, late = early_late_lag(PIPELINE)
    assert early == pytest.approx(2.5)  # first bucket: mean of 2.0 and 3.0
    assert late == pytest.approx(0.5)  # last bucket with data (only step 1 reaches it)
    assert early_late_lag(CONVENTIONAL) == (pytest.approx(0.5), pytest.approx(0.5))
    assert early_late_lag([]) == (None, None)


def test_lag_fractions_sum_to_one_and_drop_empty_trailing_bins():
    assert lag_fractions(PIPELINE) == pytest.approx([3 / 8, 4 / 8, 1 / 8])
    assert lag_fractions(CONVENTIONAL) == pytest.approx([0.5, 0.5])


def test_paper_figures_has_four_panels_with_every_run():
    figure = paper_figures({"pipeline": PIPELINE, "conventional G=8": CONVENTIONAL}, title="t")
    axes = figure.get_axes()
    assert len(axes) == 4
    assert [a.get_title() for a in axes] == [
        "(a) lag against token position",
        "(b) lag histogram",
        "(c) effective sample size per step",
        "(d) reward against wall time",
    ]
    for panel in axes:
        assert panel.get_xlabel() and panel.get_ylabel(), panel.get_title()
        labels = [text.get_text() for text in panel.get_legend().get_texts()]
        assert any(label.startswith("pipeline") for label in labels), labels
        assert any(label.startswith("conventional G=8") for label in labels), labels
    position_line = axes[0].get_lines()[0]
    assert list(position_line.get_xdata()) == [0, 8, 16, 24]
    assert list(position_line.get_ydata()) == pytest.approx([2.5, 2.0, 1.0, 0.5])
