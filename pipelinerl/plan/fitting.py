"""Least squares with every coefficient 0 or more: the fits of ``plan calibrate`` (a cost is never
negative, and a coefficient the data cannot tell from 0 is better 0 than a negative that cancels another)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def nonnegative_fit(columns: Sequence[Sequence[float]], target: Sequence[float]) -> list[float]:
    """Least squares of ``target`` on ``columns`` with every coefficient 0 or more: a column whose
    coefficient comes out below 0 is dropped (its coefficient 0) and the rest fitted again."""
    keep = list(range(len(columns)))
    y = np.asarray(target, dtype=float)
    while keep:
        x = np.column_stack([np.asarray(columns[i], dtype=float) for i in keep])
        solution = np.linalg.lstsq(x, y, rcond=None)[0]
        if (solution >= 0).all():
            coefficients = [0.0] * len(columns)
            for index, value in zip(keep, solution, strict=True):
                coefficients[index] = float(value)
            return coefficients
        keep.pop(int(np.argmin(solution)))
    return [0.0] * len(columns)
