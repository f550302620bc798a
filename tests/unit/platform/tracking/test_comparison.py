"""Time to target, default target and speed-ups of a comparison, on hand-made learning curves."""

from __future__ import annotations

import pytest

from pipelinerl.platform.tracking.comparison import (
    compare_runs,
    default_target,
    smoothed_rewards,
    time_to_target,
)


def curve(rewards: list[float], seconds_per_step: float, samples_per_step: int = 8) -> list[dict]:
    return [
        {
            "rl/reward_mean": r,
            "wall_s": seconds_per_step * (i + 1),
            "samples/trained": samples_per_step * (i + 1),
        }
        for i, r in enumerate(rewards)
    ]


def summary(mode: str) -> dict:
    return {
        "mode": mode,
        "ess_mean": 0.9,
        "lag_mean": 1.0,
        "lag_max": 3,
        "eval_success_start": 0.1,
        "eval_success_end": 0.2,
        "wall_s": 10.0,
    }


def test_smoothing_is_a_trailing_mean():
    records = curve([0.0, 1.0, 0.5, 0.5], 1.0)
    assert smoothed_rewards(records, window=2) == [0.0, 0.5, 0.75, 0.5]
    assert smoothed_rewards(records, window=1) == [0.0, 1.0, 0.5, 0.5]
    with pytest.raises(ValueError, match="window"):
        smoothed_rewards(records, window=0)


def test_time_to_target_is_the_first_step_at_or_above_it():
    records = curve([0.1, 0.2, 0.4, 0.3, 0.5], 2.0)
    assert time_to_target(records, 0.4, window=1) == 6.0
    assert time_to_target(records, 0.36, window=2) == 10.0  # smoothed: .1 .15 .3 .35 .4 -> step 5
    assert time_to_target(records, 0.9, window=1) is None


def test_default_target_is_what_every_run_reached():
    runs = {"fast": curve([0.2, 0.6, 0.8], 1.0), "slow": curve([0.2, 0.3, 0.5], 1.0)}
    assert default_target(runs, window=1) == 0.5


def test_time_vs_reference_is_relative_to_the_reference():
    runs = {"pipeline": curve([0.2, 0.6, 0.8], 1.0), "conventional": curve([0.2, 0.4, 0.6, 0.7], 3.0)}
    target, rows = compare_runs(
        runs,
        {"pipeline": summary("pipeline"), "conventional": summary("conventional")},
        reference="pipeline",
        target=0.6,
        window=1,
    )
    assert target == 0.6
    by_label = {row.label: row for row in rows}
    assert by_label["pipeline"].time_to_target_s == 2.0 and by_label["pipeline"].time_vs_reference == 1.0
    assert by_label["conventional"].time_to_target_s == 9.0
    assert by_label["conventional"].samples_to_target == 24
    assert by_label["conventional"].time_vs_reference == 4.5


def test_a_run_that_never_reaches_the_target_has_no_time_vs_reference():
    runs = {"pipeline": curve([0.9], 1.0), "conventional": curve([0.1], 1.0)}
    _, rows = compare_runs(
        runs,
        {"pipeline": summary("pipeline"), "conventional": summary("conventional")},
        reference="pipeline",
        target=0.5,
        window=1,
    )
    assert rows[1].time_to_target_s is None and rows[1].time_vs_reference is None
    with pytest.raises(ValueError, match="reference run 'async'"):
        compare_runs(runs, {}, reference="async")
