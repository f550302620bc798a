"""Time to target, default target, baselines, times faster and where an evaluation sits, on
hand-made learning curves."""

from __future__ import annotations

import pytest

from pipelinerl.platform.tracking.comparison import (
    TrainedAt,
    baselines,
    compare_runs,
    default_target,
    smoothed_rewards,
    time_to_target,
    trained_at,
    trained_at_each,
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


def test_every_run_is_timed_against_the_conventional_run_in_one_direction():
    runs = {"pipeline": curve([0.2, 0.6, 0.8], 1.0), "conventional": curve([0.2, 0.4, 0.6, 0.7], 3.0)}
    target, rows = compare_runs(
        runs,
        {"pipeline": summary("pipeline"), "conventional": summary("conventional")},
        target=0.6,
        window=1,
    )
    assert target == 0.6
    by_label = {row.label: row for row in rows}
    assert by_label["pipeline"].time_to_target_s == 2.0
    assert by_label["conventional"].time_to_target_s == 9.0
    assert by_label["conventional"].samples_to_target == 24
    # 9 s against 2 s: the pipeline got there 4.5 times faster; the baseline against itself is 1.
    assert by_label["pipeline"].times_faster_than == {"conventional": 4.5}
    assert by_label["conventional"].times_faster_than == {"conventional": 1.0}


def test_a_run_that_never_reaches_the_target_has_no_ratio():
    runs = {"pipeline": curve([0.9], 1.0), "conventional": curve([0.1], 1.0)}
    _, rows = compare_runs(
        runs,
        {"pipeline": summary("pipeline"), "conventional": summary("conventional")},
        target=0.5,
        window=1,
    )
    assert rows[0].times_faster_than == {"conventional": None}, "the baseline never got there"
    assert rows[1].time_to_target_s is None and rows[1].times_faster_than == {"conventional": None}
    with pytest.raises(ValueError, match=r"baseline runs \['async'\] are not among the runs"):
        compare_runs(runs, {}, baseline_labels=["async"])


def test_the_baselines_are_the_conventional_runs_else_the_first():
    assert baselines({"pipeline": "pipeline", "conventional-G2": "conventional"}) == ["conventional-G2"]
    assert baselines({"a": "conventional", "b": "pipeline", "c": "conventional"}) == ["a", "c"]
    assert baselines({"async": "async", "pipeline": "pipeline"}) == ["async"]
    assert baselines({}) == []


def step(version: int, wall_s: float, samples: int = 16) -> dict:
    return {
        "policy_version": version,
        "wall_s": wall_s,
        "samples/trained": samples * version,
        "trainer/samples": samples,
    }


def test_an_evaluation_sits_where_its_policy_was_trained():
    records = [step(v, 3.0 * v) for v in range(1, 5)]
    assert trained_at(2, records) == TrainedAt(6.0, 32)
    assert trained_at(4, list(reversed(records))) == (12.0, 64), "records in any order"
    assert trained_at(0, records) == TrainedAt(0.0, 0), "version 0: the run's start"
    assert trained_at(0, []) == TrainedAt(0.0, 0)


def test_a_version_beyond_the_newest_record_is_not_placed_yet():
    records = [step(v, 3.0 * v) for v in range(1, 5)]
    assert trained_at(5, records) is None, "not at the newest known point, which would favour the run"
    assert trained_at(3, [r for r in records if r["policy_version"] != 3]) is None, "a gap"
    assert trained_at(1, []) is None


def test_a_resumed_run_starts_at_its_checkpoints_version():
    # Resumed from the checkpoint of version 10 (160 samples): the first step trains version 11.
    records = [{"policy_version": 11, "wall_s": 2.5, "samples/trained": 176, "trainer/samples": 16}]
    assert trained_at(10, records) == TrainedAt(0.0, 160)
    before_renames = [{"policy_version": 11, "wall_s": 2.5, "samples/trained": 176, "samples": 16}]
    assert trained_at(10, before_renames) == TrainedAt(0.0, 160)
    assert trained_at(10, [{"policy_version": 11, "wall_s": 2.5, "samples/trained": 176}]) == (0.0, None)


def test_a_conventional_runs_final_evaluation_sits_at_its_last_step_not_when_it_finished():
    # Conventional, G = 4: weights go out after steps 4 and 8; 8 steps end 29 s into training. The
    # final evaluation was logged at 63 s (it runs on the final policy after training): it belongs
    # at 29 s, where version 8 was trained, as do the in-run one of version 4 and the start.
    wall = [2.0, 4.0, 6.0, 14.5, 17.0, 19.0, 21.0, 29.0]
    records = [step(v, wall[v - 1], samples=32) for v in range(1, 9)]
    assert trained_at_each([0, 4, 8], records) == [(0.0, 0), (14.5, 128), (29.0, 256)]
