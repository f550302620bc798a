"""How runs of different modes compare: time to a target success, speed-ups, ESS and lag. Pure.

The learning curve of a run is its train reward per optimizer step (the verifier's success on
the freshly sampled train problems of that step), smoothed by a trailing mean over ``window``
steps so that one lucky batch does not count as reaching the target. A run reaches the target at
the wall time (seconds since its training started) of the first step whose smoothed reward is at
least the target.

Unless a target is given, it is the highest smoothed reward that *every* run reached, so each run
has a time to target and the speed-ups are defined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Record = Mapping[str, Any]
DEFAULT_WINDOW = 5


def smoothed_rewards(records: Sequence[Record], window: int = DEFAULT_WINDOW) -> list[float]:
    """Trailing mean of ``rl/reward_mean`` over up to ``window`` steps."""
    if window < 1:
        raise ValueError(f"window must be >= 1 step, got {window}")
    rewards = [float(r["rl/reward_mean"]) for r in records]
    return [
        sum(rewards[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1))
        for i in range(len(rewards))
    ]


def time_to_target(records: Sequence[Record], target: float, window: int = DEFAULT_WINDOW) -> float | None:
    """Wall seconds until the smoothed reward first reaches ``target``; None if it never does."""
    for record, reward in zip(records, smoothed_rewards(records, window), strict=True):
        if reward >= target:
            return float(record["wall_s"])
    return None


def default_target(runs: Mapping[str, Sequence[Record]], window: int = DEFAULT_WINDOW) -> float:
    """The highest smoothed reward every run reached."""
    peaks = [max(smoothed_rewards(records, window), default=0.0) for records in runs.values()]
    return min(peaks, default=0.0)


@dataclass(frozen=True)
class ModeRow:
    label: str
    mode: str
    time_to_target_s: float | None
    samples_to_target: int | None
    # This run's time to target divided by the reference run's: 2.0 means it took twice as long as the
    # reference (the reference was 2x faster); 1.0 for the reference itself.
    time_vs_reference: float | None
    ess_mean: float
    lag_mean: float
    lag_max: int
    eval_success_start: float
    eval_success_end: float
    wall_s: float


def compare_runs(
    runs: Mapping[str, Sequence[Record]],
    summaries: Mapping[str, Mapping[str, Any]],
    *,
    reference: str,
    target: float | None = None,
    window: int = DEFAULT_WINDOW,
) -> tuple[float, list[ModeRow]]:
    """The target used and one row per run; ``time_vs_reference`` is relative to the ``reference`` run."""
    if reference not in runs:
        raise ValueError(f"reference run {reference!r} is not one of {sorted(runs)}")
    goal = default_target(runs, window) if target is None else target
    times = {label: time_to_target(records, goal, window) for label, records in runs.items()}
    reference_time = times[reference]
    rows = []
    for label, records in runs.items():
        summary = summaries[label]
        time_s = times[label]
        samples = None
        if time_s is not None:
            samples = next(int(r["samples/trained"]) for r in records if float(r["wall_s"]) == time_s)
        time_vs_reference = None
        if time_s is not None and reference_time:
            time_vs_reference = time_s / reference_time
        rows.append(
            ModeRow(
                label=label,
                mode=str(summary["mode"]),
                time_to_target_s=time_s,
                samples_to_target=samples,
                time_vs_reference=time_vs_reference,
                ess_mean=float(summary["ess_mean"]),
                lag_mean=float(summary["lag_mean"]),
                lag_max=int(summary["lag_max"]),
                eval_success_start=float(summary["eval_success_start"]),
                eval_success_end=float(summary["eval_success_end"]),
                wall_s=float(summary["wall_s"]),
            )
        )
    return goal, rows
