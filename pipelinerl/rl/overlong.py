"""DAPO's soft overlong punishment: a reward penalty that grows linearly over the last tokens of the budget.

Role: a sequence cut at the generation budget gets a reward that says nothing about its reasoning; DAPO
instead adds a length-aware penalty to the reward of long sequences, 0 up to ``max_length - buffer`` tokens,
falling linearly to -1 at ``max_length``, and -1 beyond. The preprocessor adds it to a sequence's reward
before advantages are computed.

Formula (Yu et al. 2025, eq. 13, with ``L_max = max_length`` and ``L_cache = buffer``)::

    R(y) = 0                                       if |y| <= L_max - L_cache
         = ((L_max - L_cache) - |y|) / L_cache     if L_max - L_cache < |y| <= L_max
         = -1                                      if |y| > L_max

Invariants: the penalty lies in [-1, 0], is non-increasing in the length, continuous up to ``max_length``
(where it is -1), and depends only on the three integers.

Pure numpy (no torch), like ``advantages.py``, so the preprocessor never loads torch. DAPO uses
``L_max = 20480`` (its generation budget) and ``L_cache = 4096``.

Reference: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv 2503.14476, §3.4, eq. 13.
"""

from __future__ import annotations

import numbers

import numpy as np
import numpy.typing as npt

__all__ = ["overlong_penalties", "overlong_penalty"]


def _validate(max_length: int, buffer: int) -> None:
    for name, value in (("max_length", max_length), ("buffer", buffer)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    if not 1 <= buffer <= max_length:
        raise ValueError(f"buffer must be between 1 and max_length ({max_length}), got {buffer}")


def overlong_penalty(length: int, max_length: int, buffer: int) -> float:
    """DAPO's soft overlong penalty of one sequence of ``length`` tokens (see the module docstring).

    Args:
        length: the sequence's generated token count (>= 0).
        max_length: ``L_max``, the length at which the penalty reaches -1 (>= 1).
        buffer: ``L_cache``, the width of the linear ramp (1 <= buffer <= max_length).

    Returns:
        the penalty in [-1, 0], to add to the sequence's reward.

    Raises:
        ValueError: a non-integer or negative length, ``max_length < 1``, or ``buffer`` outside
            ``[1, max_length]``.
    """
    _validate(max_length, buffer)
    if isinstance(length, bool) or not isinstance(length, numbers.Integral):
        raise ValueError(f"length must be an integer, got {length!r}")
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    threshold = max_length - buffer
    if length <= threshold:
        return 0.0
    if length <= max_length:
        return (threshold - length) / buffer
    return -1.0


def overlong_penalties(lengths: npt.ArrayLike, max_length: int, buffer: int) -> np.ndarray:
    """:func:`overlong_penalty` of each entry of integer ``lengths`` (any shape), as a float64 array.

    Raises:
        ValueError: a non-integer array, a negative length, or the bounds :func:`overlong_penalty` refuses.
    """
    _validate(max_length, buffer)
    array = np.asarray(lengths)
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"lengths must be an integer array, got dtype {array.dtype}")
    array = array.astype(np.int64)
    if array.size and int(array.min()) < 0:
        raise ValueError(f"lengths must be >= 0, got a minimum of {int(array.min())}")
    threshold = max_length - buffer
    ramp = (threshold - array) / buffer
    return np.where(array <= threshold, 0.0, np.where(array <= max_length, ramp, -1.0)).astype(np.float64)
