"""How many times faster one run is than another: the one ratio every output uses. Pure.

``times_faster(run_s=..., baseline_s=...)`` is the baseline's time divided by the run's (time to a
target reward or success, or time of a weight update): 2.0 means the run got there in half the
baseline's time, 0.5 that it took twice as long, 1.0 for the baseline itself. Both arguments are
keyword-only so that no call can swap them. Wherever it is written, its name says the direction:

* in a run's own row (the dashboard's comparison table, ``pipelinerl compare``'s rows, the learning
  benchmark's PipelineRL row): ``times_faster_than``, a mapping ``{baseline: ratio}``;
* as one flat key (MLflow metrics of a comparison's or a benchmark's parent run, the learning
  benchmark's headline): ``times_faster_key(run, baseline)``, ``<run>/times_faster_than_<baseline>``,
  e.g. ``pipeline/times_faster_than_conventional_g8``;
* in a table heading: ``times_faster_heading(baseline)``, ``× faster than <baseline>``, explained by
  ``TIMES_FASTER_MEANING``; a cell reads ``times_faster_text(ratio)``, e.g. ``2.00×``.

Records written before this definition (issue 25) used other keys; they stay readable:

* ``pipelinerl bench learning`` records (``docs/benchmarks/learning*.json``) and their MLflow parent
  runs: headline ``speedup_vs_<baseline>`` and ``speedup_vs_<baseline>_per_seed``, and the baseline
  rows' ``speedup`` / ``speedup_per_seed``: PipelineRL's ratio in the same direction, read as is by
  ``headline_times_faster`` and ``pipeline_times_faster``;
* ``pipelinerl bench weights`` records: headline ``speedup_over_per_tensor``, the fastest bucket size
  against one broadcast per tensor, same direction (now ``fastest/times_faster_than_per_tensor``);
* ``pipelinerl compare``'s ``comparison.json`` and parent-run metrics ``<label>/time_vs_reference``:
  the run's time ÷ the reference's (the first mode's), the *inverse* direction:
  ``from_time_vs_reference`` turns it into ``times_faster_than[<reference>]``;
* the dashboard API's ``speedup_vs`` (same direction; never stored).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TIMES_FASTER_MEANING = (
    "times faster than B = B's time to the target ÷ this run's (above 1: this run got there sooner)"
)


def times_faster(*, run_s: float | None, baseline_s: float | None) -> float | None:
    """``baseline_s / run_s``: how many times faster the run is than the baseline.

    None where either time is missing (that run never reached the target), where the run's time is
    0 (reached at its start: no finite ratio) and where either is negative (not a duration: the
    clocks of two hosts disagree)."""
    if run_s is None or baseline_s is None or run_s <= 0 or baseline_s < 0:
        return None
    return baseline_s / run_s


def times_faster_key(run: str, baseline: str) -> str:
    """The flat key of ``run``'s ratio against ``baseline`` (MLflow metric, headline field)."""
    return f"{run}/times_faster_than_{baseline}"


def times_faster_heading(baseline: str) -> str:
    return f"× faster than {baseline}"


def times_faster_text(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}×"


def headline_times_faster(
    headline: Mapping[str, Any], baseline: str, *, run: str = "pipeline", per_seed: bool = False
) -> Any:
    """``run``'s ratio against ``baseline`` from a benchmark headline, old or new (the seeds' list
    with ``per_seed``): the key ``times_faster_key(run, baseline)`` (+ ``_per_seed``), else, for
    PipelineRL in records before issue 25, ``speedup_vs_<baseline>`` (+ ``_per_seed``); None if
    neither is there."""
    suffix = "_per_seed" if per_seed else ""
    key = times_faster_key(run, baseline) + suffix
    if key in headline:
        return headline[key]
    if run == "pipeline":
        return headline.get(f"speedup_vs_{baseline}{suffix}")
    return None


def pipeline_times_faster(record: Mapping[str, Any], baseline: str) -> float | None:
    """PipelineRL's ratio against ``baseline`` from a learning benchmark record (its ``variants``
    rows): the PipelineRL row's ``times_faster_than``, else (records before issue 25) the baseline
    row's own ``speedup``; 1.0 against itself."""
    if baseline == "pipeline":
        return 1.0
    rows = {row["variant"]: row for row in record["variants"]}
    pipeline = rows.get("pipeline", {})
    if "times_faster_than" in pipeline:
        value = pipeline["times_faster_than"].get(baseline)
        return None if value is None else float(value)
    legacy = rows.get(baseline, {}).get("speedup")
    return None if legacy is None else float(legacy)


def from_time_vs_reference(time_vs_reference: float | None) -> float | None:
    """An old ``pipelinerl compare`` row's ``time_vs_reference`` (its time ÷ the reference's) as
    ``times_faster_than[<reference>]`` (the reference's time ÷ its): the reciprocal."""
    if time_vs_reference is None or time_vs_reference <= 0:
        return None
    return 1.0 / time_vs_reference
