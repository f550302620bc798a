"""The dashboard's numbers, computed from what the readers returned. Pure: rows in, plain data out.

* ``run_state``: status with the heartbeat (a ``running`` run whose newest step is old is flagged);
* ``step_columns``: a run's steps as columns against version, wall time and samples, downsampled,
  with the trailing mean of the reward that the time to target is read from;
* ``eval_series``: held-out evaluations, each placed where its policy was trained (not when it ended);
* ``stage_boxes``: throughput, idle fractions and queues of the three stages, over the newest records;
* ``lag_heatmap``: lag against token position over steps (the paper's figure), downsampled in steps;
* ``comparison_table``: time (and samples) to a target reward per run and how many times faster each
  run got there than each baseline.

The definitions these share with the terminal, MLflow and the benchmarks are
``platform/tracking/comparison.py``'s (trailing mean, baselines, where an evaluation sits) and
``platform/tracking/ratios.py``'s (times faster).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.tracking.comparison import (
    DEFAULT_WINDOW,
    baselines,
    default_target,
    smoothed_rewards,
    trained_at_each,
)
from pipelinerl.platform.tracking.liveness import HEARTBEAT_STALE_S
from pipelinerl.platform.tracking.ratios import TIMES_FASTER_MEANING, times_faster
from pipelinerl.ui.queries import STEP_COLUMNS, PolicyVersionRow, StepRow
from pipelinerl.ui.sampling import keep_indices_of_columns

if TYPE_CHECKING:  # the reader's client module is not needed to compute on its points
    from pipelinerl.ui.mlflow_reader import MetricPoint

# A running run whose newest step is older than this is shown as silent: the launcher may be gone.
# Generous: a step of a large model, or the evaluation at the start, can take minutes.
STALE_AFTER_S = 600.0
# Columns whose extremes the downsampling keeps (the others follow the same rows).
SHAPED_COLUMNS = ("reward_mean", "ess", "lag_max")
# The newest records that make a stage box's figure (a mean over the last few updates or steps).
STAGE_WINDOW = 5


@dataclass(frozen=True, slots=True)
class RunState:
    status: str
    heartbeat_age_s: float | None  # seconds since the newest step (or since the start, before one)
    silent: bool  # running, but nothing recorded for STALE_AFTER_S


def run_state(
    status: str,
    started_at: datetime,
    last_step_at: datetime | None,
    now: datetime,
    heartbeat_at: datetime | None = None,
) -> RunState:
    """A running run is silent when its launcher's heartbeat stopped for HEARTBEAT_STALE_S (runs
    recorded before heartbeats existed: when its newest step is older than STALE_AFTER_S)."""
    if heartbeat_at is not None:
        beat = max(heartbeat_at, last_step_at or heartbeat_at)
        limit_s = HEARTBEAT_STALE_S
    else:
        beat, limit_s = last_step_at or started_at, STALE_AFTER_S
    age = max(0.0, (now - beat).total_seconds())
    return RunState(status, age, status == "running" and age > limit_s)


def wall_time_s(started_at: datetime, ended_at: datetime | None, now: datetime) -> float:
    return max(0.0, ((ended_at or now) - started_at).total_seconds())


def training_started_at(steps: Sequence[StepRow], run_started_at: datetime) -> datetime:
    """When the trainer began waiting for its first batch: the first step's time less its step and
    wait seconds. Wall-time axes start there, as the launcher's comparison does (``wall_s`` of the
    trainer's records), so that start-up (model load, the evaluation before training) does not
    dilute the time to a target; before any step, the run's start."""
    if not steps:
        return run_started_at
    first = steps[0]
    spent_s = (first.values["step_s"] or 0.0) + (first.values["wait_s"] or 0.0)
    return max(run_started_at, first.created_at - timedelta(seconds=spent_s))


def step_columns(
    steps: Sequence[StepRow], started_at: datetime, max_points: int, window: int = DEFAULT_WINDOW
) -> dict[str, Any]:
    """Steps as columns (``version``, ``wall_s`` since ``started_at``, ``samples_trained`` and every
    ``STEP_COLUMNS``), at most ``max_points`` rows, chosen so that each shaped column keeps its extremes.
    ``reward_trailing_mean`` is ``comparison.smoothed_rewards`` over ``window`` (``reward_window``)
    steps, the series ``comparison_table`` reads the time to target from, taken over every step
    before the downsampling."""
    trailing = reward_trailing_mean(steps, window)
    rows = keep_indices_of_columns(
        [[step.values[name] for step in steps] for name in SHAPED_COLUMNS], max_points
    )
    chosen = [steps[i] for i in rows]
    columns: dict[str, Any] = {
        "version": [step.version for step in chosen],
        "wall_s": [round((step.created_at - started_at).total_seconds(), 3) for step in chosen],
        "samples_trained": [step.samples_trained for step in chosen],
    }
    for name in STEP_COLUMNS:
        columns[name] = [step.values[name] for step in chosen]
    columns["reward_trailing_mean"] = [trailing[i] for i in rows]  # unrounded: the same ≥ target
    columns["reward_window"] = window
    columns["total_steps"] = len(steps)
    columns["returned_steps"] = len(chosen)
    return columns


def rewards_of(steps: Sequence[StepRow]) -> list[float]:
    """The train reward of each step as the comparison reads it (a step without one counts as 0)."""
    return [step.values["reward_mean"] or 0.0 for step in steps]


def reward_trailing_mean(steps: Sequence[StepRow], window: int = DEFAULT_WINDOW) -> list[float]:
    """``comparison.smoothed_rewards`` of the steps' train reward: what the time to target uses."""
    return smoothed_rewards([{registry.REWARD_MEAN: reward} for reward in rewards_of(steps)], window)


def trainer_points(rows: Sequence[StepRow | PolicyVersionRow], started_at: datetime) -> list[dict[str, Any]]:
    """Steps or policy versions (both the trainer's record of a step) as the fields
    ``comparison.trained_at`` reads: ``policy_version``, ``wall_s`` since ``started_at`` (as
    ``step_columns`` has it), ``samples/trained`` and, for steps, ``trainer/samples`` (the step's own,
    the database's ``samples`` column). A version given twice keeps its last row."""
    return [
        {
            registry.POLICY_VERSION: row.version,
            registry.WALL_S: round((row.created_at - started_at).total_seconds(), 3),
            registry.SAMPLES_TRAINED: row.samples_trained,
            **({registry.TRAINER_SAMPLES: row.values["samples"]} if isinstance(row, StepRow) else {}),
        }
        for row in rows
    ]


def eval_series(
    histories: Mapping[str, Sequence[MetricPoint]], trainer_records: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One series per evaluation metric (its points' step is the evaluated policy version), each point
    at the wall time and samples of the trainer step that produced that version
    (``comparison.trained_at``), not at the time the evaluation was logged: the final evaluation of a
    run runs after training and would otherwise be drawn late. A point whose version has no trainer
    record yet is left out until it has one."""
    series = []
    for name in sorted(histories):
        points = histories[name]
        placed = [
            (point, where)
            for point, where in zip(
                points, trained_at_each([p.step for p in points], trainer_records), strict=True
            )
            if where is not None
        ]
        series.append(
            {
                "name": name,
                "version": [point.step for point, _ in placed],
                "wall_s": [round(where.wall_s, 3) for _, where in placed],
                "samples_trained": [where.samples for _, where in placed],
                "value": [point.value for point, _ in placed],
            }
        )
    return series


def lag_heatmap(records: Sequence[Mapping[str, Any]], max_steps: int) -> dict[str, Any]:
    """Mean lag by token-position bucket (rows) and step (columns), from trainer records that carry
    ``lag/by_position``; at most ``max_steps`` evenly spread steps, always the newest."""
    usable = [r for r in records if isinstance(r.get(registry.LAG_BY_POSITION), list)]
    if len(usable) > max_steps:
        stride = len(usable) / max_steps
        picked = sorted({int(i * stride) for i in range(max_steps - 1)} | {len(usable) - 1})
        usable = [usable[i] for i in picked]
    buckets = max((len(r[registry.LAG_BY_POSITION]) for r in usable), default=0)
    bucket_size = next(
        (int(r[registry.LAG_POSITION_BUCKET_SIZE]) for r in usable if registry.LAG_POSITION_BUCKET_SIZE in r),
        1,
    )
    values = [
        [r[registry.LAG_BY_POSITION][b] if b < len(r[registry.LAG_BY_POSITION]) else None for r in usable]
        for b in range(buckets)
    ]
    return {
        "versions": [int(r[registry.POLICY_VERSION]) for r in usable],
        "position_start": [b * bucket_size for b in range(buckets)],
        "bucket_size": bucket_size,
        "mean_lag": values,
    }


def stage_boxes(
    recent_steps: Sequence[StepRow],
    *,
    actor_tokens_per_s: float | None,
    actor_idle: float | None,
    rollout_queue: float | None,
    preprocessor_records: Sequence[Mapping[str, Any]],
    by_actor: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The three stages as the run page draws them: the actors' tokens/s and idle fraction since their
    previous weight update (all actors, and ``by_actor``: each one's, with its ``actor_id``) and the
    rollouts queued at the preprocessor (the latest values), then over the last ``STAGE_WINDOW``
    records the preprocessor's delivery rate and the share of time it held batches back for the
    trainer, the batches sent ahead of the trainer, and the trainer's tokens/s and idle fraction:
    ``metric_registry``'s, over the window's summed step, broadcast and wait seconds (so a window of
    one step shows what MLflow logged for it). Each box names its metrics and their units."""
    window = [registry.record_of_columns(step.values) for step in recent_steps]
    trainer_tokens_per_s = registry.derive_over(registry.TRAINER_TOKENS_PER_S, window)
    trainer_idle = registry.derive_over(registry.TRAINER_IDLE_FRACTION, window)
    last_sent = preprocessor_records[-1] if preprocessor_records else None
    return {
        "actor": {
            "tokens_per_s": actor_tokens_per_s,
            "idle_fraction": actor_idle,
            "by_actor": list(by_actor),
            **_described(
                tokens_per_s=registry.ACTOR_TOKENS_PER_S, idle_fraction=registry.ACTOR_IDLE_FRACTION
            ),
        },
        "rollout_queue": rollout_queue,
        "preprocessor": {
            "batches_sent": None if last_sent is None else int(last_sent.get(registry.STEP, -1)) + 1,
            "samples_per_s": _samples_per_s(recent_steps),
            "held_fraction": _held_fraction(preprocessor_records[-(STAGE_WINDOW + 1) :]),
        },
        "batches_ahead": None
        if last_sent is None
        else max(0, int(last_sent.get(registry.STEP, 0)) - int(last_sent.get(registry.TRAINER_VERSION, 0))),
        "trainer": {
            "tokens_per_s": None if trainer_tokens_per_s is None else round(trainer_tokens_per_s, 3),
            "idle_fraction": None if trainer_idle is None else round(trainer_idle, 4),
            **_described(
                tokens_per_s=registry.TRAINER_TOKENS_PER_S, idle_fraction=registry.TRAINER_IDLE_FRACTION
            ),
        },
    }


def _described(**fields: str) -> dict[str, dict[str, str]]:
    """What a box's figures are: each field's registry name and unit (the page prints the unit)."""
    declared = {field: registry.declaration(name) for field, name in fields.items()}
    return {
        "metrics": fields,
        "units": {field: metric.unit for field, metric in declared.items() if metric is not None},
    }


def _samples_per_s(steps: Sequence[StepRow]) -> float | None:
    """Samples the trainer received per second over the steps (what the preprocessor delivered)."""
    if len(steps) < 2:
        return None
    elapsed = (steps[-1].created_at - steps[0].created_at).total_seconds()
    samples = sum(s.values[registry.column_of(registry.TRAINER_SAMPLES)] or 0 for s in steps[1:])
    return round(samples / elapsed, 3) if elapsed > 0 else None


def _held_fraction(records: Sequence[Mapping[str, Any]]) -> float | None:
    """The share of the time between the first and last record that the preprocessor held finished
    batches back because the trainer was behind (``preprocessor/held_s``)."""
    if len(records) < 2:
        return None
    elapsed = float(records[-1][registry.TIME]) - float(records[0][registry.TIME])
    held = sum(float(r.get(registry.PREPROCESSOR_HELD_S, 0.0)) for r in records[1:])
    return round(min(1.0, held / elapsed), 4) if elapsed > 0 else None


@dataclass(frozen=True, slots=True)
class ComparedRun:
    """One run of a comparison: its label, mode and train reward by step (wall seconds, samples)."""

    run_id: str
    label: str
    mode: str
    rewards: Sequence[float]
    wall_s: Sequence[float]
    samples: Sequence[int | None]
    ess: Sequence[float | None]
    lag_mean: Sequence[float | None]
    lag_max: Sequence[float | None]


def comparison_table(
    runs: Sequence[ComparedRun], target: float | None = None, window: int = DEFAULT_WINDOW
) -> dict[str, Any]:
    """Time and samples until each run's trailing-mean train reward first reaches ``target`` (by
    default the highest such reward that every run reached), and how many times faster each run got
    there than each baseline (``comparison.baselines``: the conventional runs, else the first),
    ``times_faster_than[B]`` = B's time ÷ this run's (``ratios.times_faster``). Also mean ESS and lag."""
    records = {
        run.run_id: [{registry.REWARD_MEAN: reward} for reward in run.rewards] for run in runs if run.rewards
    }
    goal = target if target is not None else (default_target(records, window) if records else None)
    baseline_ids = baselines({run.run_id: run.mode for run in runs})
    baseline_runs = [run for run in runs if run.run_id in baseline_ids]
    reached: dict[str, tuple[float, int | None] | None] = {}
    for run in runs:
        reached[run.run_id] = None
        if goal is None or not run.rewards:
            continue
        for index, reward in enumerate(smoothed_rewards(records[run.run_id], window)):
            if reward >= goal:
                reached[run.run_id] = (run.wall_s[index], run.samples[index])
                break
    rows = []
    for run in runs:
        hit = reached[run.run_id]
        ratios = {}
        for baseline in baseline_runs:
            base = reached[baseline.run_id]
            ratio = times_faster(
                run_s=None if hit is None else hit[0], baseline_s=None if base is None else base[0]
            )
            ratios[baseline.label] = None if ratio is None else round(ratio, 3)
        rows.append(
            {
                "run_id": run.run_id,
                "label": run.label,
                "mode": run.mode,
                "time_to_target_s": None if hit is None else round(hit[0], 3),
                "samples_to_target": None if hit is None else hit[1],
                "times_faster_than": ratios,
                "ess_mean": _mean(run.ess),
                "lag_mean": _mean(run.lag_mean),
                "lag_max": max((v for v in run.lag_max if v is not None), default=None),
                "steps": len(run.rewards),
            }
        )
    return {
        "target": goal,
        "window": window,
        "baselines": [baseline.label for baseline in baseline_runs],
        "meaning": TIMES_FASTER_MEANING,
        "rows": rows,
    }


def _mean(values: Sequence[float | int | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return round(sum(present) / len(present), 6) if present else None
