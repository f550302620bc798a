"""DAPO's soft overlong punishment: eq. 13 by hand, DAPO's own numbers, the vectorised form, refusals."""

import numpy as np
import pytest

from pipelinerl.rl.overlong import overlong_penalties, overlong_penalty


def test_small_case_by_hand() -> None:
    # max_length 10, buffer 4: 0 up to 6 tokens, then -(length - 6) / 4 up to 10, then -1
    expected = [0.0] * 7 + [-0.25, -0.5, -0.75, -1.0, -1.0, -1.0]
    assert [overlong_penalty(length, 10, 4) for length in range(13)] == expected


def test_dapo_numbers() -> None:
    # DAPO: L_max = 20480, L_cache = 4096 (ramp from 16384 tokens)
    assert overlong_penalty(16384, 20480, 4096) == 0.0
    assert overlong_penalty(16385, 20480, 4096) == pytest.approx(-1 / 4096)
    assert overlong_penalty(18432, 20480, 4096) == -0.5
    assert overlong_penalty(20480, 20480, 4096) == -1.0
    assert overlong_penalty(20481, 20480, 4096) == -1.0


def test_a_buffer_as_long_as_max_length_ramps_from_zero() -> None:
    assert overlong_penalty(0, 8, 8) == 0.0
    assert overlong_penalty(1, 8, 8) == -1 / 8
    assert overlong_penalty(8, 8, 8) == -1.0
    assert overlong_penalty(2, 2, 1) == -1.0
    assert overlong_penalty(1, 2, 1) == 0.0


def test_vectorised_matches_scalar_and_is_bounded_and_monotone_over_random_trials() -> None:
    generator = np.random.default_rng(0)
    for _ in range(100):
        max_length = int(generator.integers(1, 300))
        buffer = int(generator.integers(1, max_length + 1))
        lengths = generator.integers(0, 2 * max_length + 2, size=40)
        penalties = overlong_penalties(lengths, max_length, buffer)
        assert penalties.dtype == np.float64
        assert penalties.tolist() == [overlong_penalty(int(n), max_length, buffer) for n in lengths]
        assert ((penalties >= -1.0) & (penalties <= 0.0)).all()
        ordered = overlong_penalties(np.sort(lengths), max_length, buffer)
        assert (np.diff(ordered) <= 0).all()


def test_vectorised_keeps_the_shape_and_accepts_empty_arrays() -> None:
    assert overlong_penalties(np.array([[0, 7], [9, 11]]), 10, 4).tolist() == [[0.0, -0.25], [-0.75, -1.0]]
    assert overlong_penalties(np.array([], dtype=np.int64), 10, 4).shape == (0,)
    assert overlong_penalties([3, 8], 10, 4).tolist() == [0.0, -0.5]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ((5, 10, 0), r"buffer must be between 1 and max_length \(10\), got 0"),
        ((5, 10, 11), r"buffer must be between 1 and max_length \(10\), got 11"),
        ((5, 0, 1), "max_length must be >= 1, got 0"),
        ((-1, 10, 4), "length must be >= 0, got -1"),
        ((2.5, 10, 4), "length must be an integer, got 2.5"),
        ((5, 10.0, 4), "max_length must be an integer, got 10.0"),
        ((5, 10, True), "buffer must be an integer, got True"),
    ],
)
def test_overlong_penalty_rejects_bad_inputs(arguments: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        overlong_penalty(*arguments)


@pytest.mark.parametrize(
    ("lengths", "max_length", "buffer", "message"),
    [
        (np.array([1.5, 2.0]), 10, 4, "lengths must be an integer array, got dtype float64"),
        (np.array([3, -2]), 10, 4, "lengths must be >= 0, got a minimum of -2"),
        (np.array([3]), 10, 0, r"buffer must be between 1 and max_length \(10\), got 0"),
    ],
)
def test_overlong_penalties_rejects_bad_inputs(lengths, max_length: int, buffer: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        overlong_penalties(lengths, max_length, buffer)
