"""How runs of different modes compare: time to a target success, speed-ups, ESS and lag. Pure.

Three things are defined here once, and every output (the terminal, MLflow, the benchmark records,
the dashboard) uses these functions:

* **The trailing mean of the train reward** (``smoothed_rewards``). The learning curve of a run is
  its train reward per optimizer step (the verifier's success on the freshly sampled train problems
  of that step), smoothed by a trailing mean over ``window`` steps so that one lucky batch does not
  count as reaching the target. A run reaches the target at the wall time (seconds since its
  training started) of the first step whose smoothed reward is at least the target. The dashboard
  draws this same series beside the raw reward.
* **Which runs are the baselines** (``baselines``): every conventional run; without one, the first.
  Each run's ratio against each baseline is ``ratios.times_faster``: the baseline's time ÷ the run's.
* **Where an evaluation sits** on the wall-time and samples axes (``trained_at``): at the trainer
  step that produced the evaluated policy, not when the evaluation finished (see its docstring).

Unless a target is given, it is the highest smoothed reward that *every* run reached, so each run
has a time to target and the speed-ups are defined.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.tracking.ratios import times_faster

Record = Mapping[str, Any]
DEFAULT_WINDOW = 5
# The modes whose runs the others are compared with (``baselines``).
BASELINE_MODES = ("conventional",)


def smoothed_rewards(records: Sequence[Record], window: int = DEFAULT_WINDOW) -> list[float]:
    """Trailing mean of ``rl/reward_mean`` over up to ``window`` steps (fewer at the start): the
    series the time to target is read from, and the one the dashboard draws beside the raw reward."""
    if window < 1:
        raise ValueError(f"window must be >= 1 step, got {window}")
    rewards = [float(r[registry.REWARD_MEAN]) for r in records]
    return [
        sum(rewards[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1))
        for i in range(len(rewards))
    ]


def time_to_target(records: Sequence[Record], target: float, window: int = DEFAULT_WINDOW) -> float | None:
    """Wall seconds until the smoothed reward first reaches ``target``; None if it never does."""
    for record, reward in zip(records, smoothed_rewards(records, window), strict=True):
        if reward >= target:
            return float(record[registry.WALL_S])
    return None


def default_target(runs: Mapping[str, Sequence[Record]], window: int = DEFAULT_WINDOW) -> float:
    """The highest smoothed reward every run reached."""
    peaks = [max(smoothed_rewards(records, window), default=0.0) for records in runs.values()]
    return min(peaks, default=0.0)


class TrainedAt(NamedTuple):
    """Where a policy version sits on a run's axes: wall seconds since training started, and samples
    trained into it (None where the records do not say)."""

    wall_s: float
    samples: int | None


def trained_at(version: int, trainer_records: Sequence[Record]) -> TrainedAt | None:
    """Where an evaluation of policy ``version`` sits: the wall time and samples of the trainer step
    that produced that version, so that an evaluation that finished late (the final one runs after
    training, in-run rounds finish while training goes on) is not drawn later than its policy was
    ready. ``trainer_records`` are the trainer's per-step records (``policy_version``, ``wall_s``,
    ``samples/trained``, optionally the step's ``trainer/samples``, ``samples`` in records written
    before the metric renames), in any order.

    * A version with a record: that record's ``wall_s`` and ``samples/trained``.
    * Version 0, or any version below the first record's (the policy the run started from: 0, or the
      checkpoint a resumed run started from): the run's start, 0 s, with 0 samples for version 0 and
      the samples trained before the first step (its ``samples/trained`` − ``trainer/samples``)
      otherwise.
    * A version beyond the newest record, or missing between two: None, not placed. Its time is not
      known yet (a live run whose step record arrives a flush after the evaluation) and putting it at
      the newest known point would draw it too early, which favours the run; it is placed once the
      record is there. A finished run has a record for every version it evaluated.
    """
    return trained_at_each([version], trainer_records)[0]


def trained_at_each(versions: Iterable[int], trainer_records: Sequence[Record]) -> list[TrainedAt | None]:
    """``trained_at`` of each version, indexing the records once (many evaluations of a long run)."""
    by_version = {int(r[registry.POLICY_VERSION]): r for r in trainer_records}
    first = by_version[min(by_version)] if by_version else None
    placed: list[TrainedAt | None] = []
    for version in versions:
        record = by_version.get(version)
        if record is not None:
            placed.append(
                TrainedAt(float(record[registry.WALL_S]), _int_or_none(record.get(registry.SAMPLES_TRAINED)))
            )
        elif version == 0:
            placed.append(TrainedAt(0.0, 0))
        elif first is not None and version < int(first[registry.POLICY_VERSION]):
            current = registry.canonical_record(first, "trainer")  # a run written before the renames too
            trained, samples = current.get(registry.SAMPLES_TRAINED), current.get(registry.TRAINER_SAMPLES)
            before = None if trained is None or samples is None else int(trained) - int(samples)
            placed.append(TrainedAt(0.0, before))
        else:
            placed.append(None)
    return placed


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def baselines(modes: Mapping[str, str]) -> list[str]:
    """The labels (of ``{label: mode}``, in order) of the runs every run is compared with: the
    conventional runs; without one, the first run."""
    found = [label for label, mode in modes.items() if mode in BASELINE_MODES]
    return found or list(modes)[:1]


@dataclass(frozen=True)
class ModeRow:
    label: str
    mode: str
    time_to_target_s: float | None
    samples_to_target: int | None
    # How many times faster this run reached the target than each baseline (``ratios.times_faster``:
    # the baseline's time ÷ this run's): 2.0 means in half the baseline's time; 1.0 for a baseline
    # against itself; None where either never reached it.
    times_faster_than: dict[str, float | None]
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
    baseline_labels: Sequence[str] | None = None,
    target: float | None = None,
    window: int = DEFAULT_WINDOW,
) -> tuple[float, list[ModeRow]]:
    """The target used and one row per run, with its ratio against each of ``baseline_labels``
    (default: ``baselines`` of the runs' modes)."""
    chosen = (
        baselines({label: str(summaries[label]["mode"]) for label in runs})
        if baseline_labels is None
        else list(baseline_labels)
    )
    unknown = [label for label in chosen if label not in runs]
    if unknown or not chosen:
        raise ValueError(f"baseline runs {unknown or chosen!r} are not among the runs {sorted(runs)}")
    goal = default_target(runs, window) if target is None else target
    times = {label: time_to_target(records, goal, window) for label, records in runs.items()}
    rows = []
    for label, records in runs.items():
        summary = summaries[label]
        time_s = times[label]
        samples = None
        if time_s is not None:
            samples = next(
                int(r[registry.SAMPLES_TRAINED]) for r in records if float(r[registry.WALL_S]) == time_s
            )
        rows.append(
            ModeRow(
                label=label,
                mode=str(summary["mode"]),
                time_to_target_s=time_s,
                samples_to_target=samples,
                times_faster_than={
                    baseline: times_faster(run_s=time_s, baseline_s=times[baseline]) for baseline in chosen
                },
                ess_mean=float(summary["ess_mean"]),
                lag_mean=float(summary["lag_mean"]),
                lag_max=int(summary["lag_max"]),
                eval_success_start=float(summary["eval_success_start"]),
                eval_success_end=float(summary["eval_success_end"]),
                wall_s=float(summary["wall_s"]),
            )
        )
    return goal, rows
