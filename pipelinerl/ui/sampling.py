"""Downsampling of long series for the charts: a chart a few hundred pixels wide gains nothing from
10,000 points, and the page must stay fast for runs of thousands of steps. Pure.

Min-max decimation: the series is cut into equal buckets and each bucket keeps its lowest and its
highest point (in their order), plus the first and last point of the whole series. Spikes survive
(a plain stride would drop the one step where the reward collapsed), and the result is a subset of
the real points, never an average that no step had.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# Points a chart gets unless the caller asks otherwise; a few per horizontal pixel of a wide chart.
DEFAULT_MAX_POINTS = 1000
MIN_MAX_POINTS = 10
MAX_MAX_POINTS = 20_000


def keep_indices(values: Sequence[float | None], max_points: int) -> list[int]:
    """Indices of the points to keep, ascending, at most ``max_points`` of them (all if fewer).

    ``None`` values (a step that lacks the metric) are never a bucket's minimum or maximum; a bucket
    holding only ``None`` keeps its first index so the x axis still covers it.
    """
    if max_points < 2:
        raise ValueError(f"max_points must be at least 2, got {max_points}")
    count = len(values)
    if count <= max_points:
        return list(range(count))
    kept = {0, count - 1}
    buckets = max(1, (max_points - 2) // 2)
    width = (count - 2) / buckets
    for bucket in range(buckets):
        start = 1 + math.floor(bucket * width)
        stop = min(count - 1, 1 + math.floor((bucket + 1) * width))
        present = [i for i in range(start, stop) if _finite(values[i])]
        if not present:
            if start < stop:
                kept.add(start)
            continue
        kept.add(min(present, key=lambda i: values[i]))  # type: ignore[arg-type,return-value]
        kept.add(max(present, key=lambda i: values[i]))  # type: ignore[arg-type,return-value]
    return sorted(kept)  # at most 2 + 2 * buckets <= max_points


def keep_indices_of_columns(columns: Sequence[Sequence[float | None]], max_points: int) -> list[int]:
    """Indices that keep the extremes of every column (rows shared by all columns, as a table needs).

    The budget is split between the columns, so the union stays within ``max_points``.
    """
    if not columns:
        return []
    count = len(columns[0])
    if count <= max_points:
        return list(range(count))
    share = max(2, max_points // len(columns))
    kept: set[int] = set()
    for column in columns:
        kept.update(keep_indices(column, share))
    return sorted(kept)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
