"""The acceptance's arithmetic (``plan/validation.py``): tolerances and the table; the comparison on
real runs is ``test_bench_learning.py``'s."""

from __future__ import annotations

import pytest

from pipelinerl.plan.validation import SIMULATED, Comparison, compare, markdown_table, within_tolerance


@pytest.mark.parametrize(
    ("figure", "measured", "predicted", "within"),
    [
        ("steady_samples_per_s", 100.0, 109.9, True),
        ("steady_samples_per_s", 100.0, 110.1, False),
        ("steady_samples_per_s", 100.0, 90.0, True),
        ("trainer_idle", 0.10, 0.15, True),
        ("trainer_idle", 0.10, 0.16, False),
        ("actor_idle", 0.40, 0.34, False),
        ("lag_mean", 1.5, 2.0, True),
        ("lag_mean", 1.5, 0.9, False),
        ("lag_max", 4, 5, True),
        ("lag_max", 4, 2, False),
    ],
)
def test_each_figure_has_its_tolerance(figure: str, measured: float, predicted: float, within: bool) -> None:
    assert within_tolerance(figure, measured, predicted) is within


def comparison(name: str, lag_max_predicted: float) -> Comparison:
    seen = {
        "steady_samples_per_s": 80.0,
        "trainer_idle": 0.1,
        "actor_idle": 0.0,
        "lag_mean": 1.5,
        "lag_max": 4.0,
    }
    predicted = {**seen, "lag_max": lag_max_predicted}
    return Comparison(
        configuration=name,
        measured=seen,
        spread={figure: (value - 1, value + 1) for figure, value in seen.items()},
        predicted=predicted,
        within={figure: within_tolerance(figure, seen[figure], predicted[figure]) for figure in SIMULATED},
        alone_speedups=(0.0, 0.0),
    )


def test_the_table_marks_what_is_outside_and_says_so_per_configuration() -> None:
    table = markdown_table([comparison("pipeline, H=32", 4.0), comparison("async", 7.0)])
    rows = table.splitlines()
    assert rows[2].startswith("| pipeline, H=32 | 80.0 (79.0–81.0) / 80.0 (+0%)") and rows[2].endswith(
        "| yes |"
    )
    assert "| 4 (3–5) / 7 ✗ | no |" in rows[3]


def test_one_configuration_cannot_be_predicted_from_the_others(tmp_path) -> None:
    with pytest.raises(ValueError, match="needs 2 or more"):
        compare({"only": [tmp_path]}, prompt_tokens=40)


def test_a_configuration_to_predict_must_be_there(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"predict=\['asnyc'\]: not among"):
        compare({"pipeline": [tmp_path], "async": [tmp_path]}, prompt_tokens=40, predict=["asnyc"])
