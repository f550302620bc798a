"""The one ratio between two runs: its direction, its undefined cases, its names, old keys read."""

from __future__ import annotations

import pytest

from pipelinerl.platform.tracking.ratios import (
    from_time_vs_reference,
    headline_times_faster,
    pipeline_times_faster,
    times_faster,
    times_faster_heading,
    times_faster_key,
    times_faster_text,
)


def test_times_faster_is_the_baselines_time_over_the_runs():
    assert times_faster(run_s=10.0, baseline_s=20.0) == 2.0, "half the baseline's time: 2x faster"
    assert times_faster(run_s=40.0, baseline_s=20.0) == 0.5, "twice the baseline's time"
    assert times_faster(run_s=20.0, baseline_s=20.0) == 1.0
    with pytest.raises(TypeError):
        times_faster(10.0, 20.0)  # type: ignore[misc]  # positional: a swap would be silent


def test_times_faster_is_undefined_without_two_durations():
    assert times_faster(run_s=None, baseline_s=20.0) is None, "the run never reached the target"
    assert times_faster(run_s=10.0, baseline_s=None) is None, "the baseline never did"
    assert times_faster(run_s=None, baseline_s=None) is None
    assert times_faster(run_s=0.0, baseline_s=20.0) is None, "reached at the start: no finite ratio"
    assert times_faster(run_s=10.0, baseline_s=0.0) == 0.0
    assert times_faster(run_s=-1.0, baseline_s=20.0) is None
    assert times_faster(run_s=10.0, baseline_s=-1.0) is None


def test_names_say_the_direction():
    assert times_faster_key("pipeline", "conventional_g8") == "pipeline/times_faster_than_conventional_g8"
    assert times_faster_heading("conventional") == "× faster than conventional"
    assert times_faster_text(2.0) == "2.00×" and times_faster_text(None) == "-"


def test_old_benchmark_keys_are_read_in_the_same_direction():
    old = {"speedup_vs_conventional_g8": 1.77, "speedup_vs_conventional_g8_per_seed": [1.7, 1.8]}
    new = {"pipeline/times_faster_than_conventional_g8": 1.5}
    assert headline_times_faster(old, "conventional_g8") == 1.77
    assert headline_times_faster(old, "conventional_g8", per_seed=True) == [1.7, 1.8]
    assert headline_times_faster(new, "conventional_g8") == 1.5
    assert headline_times_faster(new, "conventional_g1") is None
    assert headline_times_faster(old, "conventional_g8", run="async") is None

    old_record = {"variants": [{"variant": "pipeline", "speedup": 1.0}, {"variant": "g8", "speedup": 1.77}]}
    new_record = {
        "variants": [{"variant": "pipeline", "times_faster_than": {"g8": 1.5, "g1": None}}, {"variant": "g8"}]
    }
    assert pipeline_times_faster(old_record, "g8") == 1.77
    assert pipeline_times_faster(new_record, "g8") == 1.5
    assert pipeline_times_faster(new_record, "g1") is None
    assert (
        pipeline_times_faster(new_record, "pipeline") == pipeline_times_faster(old_record, "pipeline") == 1.0
    )


def test_old_compare_rows_are_inverted():
    # time_vs_reference 4.5: the run took 4.5 times the reference's time, 1/4.5 times as fast.
    assert from_time_vs_reference(4.5) == pytest.approx(1 / 4.5)
    assert from_time_vs_reference(1.0) == 1.0
    assert from_time_vs_reference(None) is None and from_time_vs_reference(0.0) is None
