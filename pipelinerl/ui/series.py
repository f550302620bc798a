"""The dashboard's numbers, computed from what the readers returned. Pure: rows in, plain data out.

* ``run_state``: status with the heartbeat (a ``running`` run whose newest step is old is flagged);
* ``step_columns``: a run's steps as columns against version, wall time and samples, downsampled;
* ``stage_boxes``: throughput, idle fractions and queues of the three stages, over the newest records;
* ``lag_heatmap``: lag against token position over steps (the paper's figure), downsampled in steps;
* ``comparison_table``: time (and samples) to a target reward per run and the ratio to each baseline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pipelinerl.platform.tracking.comparison import DEFAULT_WINDOW, default_target, smoothed_rewards
from pipelinerl.platform.tracking.liveness import HEARTBEAT_STALE_S
from pipelinerl.ui.queries import STEP_COLUMNS, StepRow
from pipelinerl.ui.sampling import keep_indices_of_columns

# A running run whose newest step is older than this is shown as silent: the launcher may be gone.
# Generous: a step of a large model, or the evaluation at the start, can take minutes.
STALE_AFTER_S = 600.0
# Columns whose extremes the downsampling keeps (the others follow the same rows).
SHAPED_COLUMNS = ("reward_mean", "ess", "lag_max")
BASELINE_MODES = ("conventional",)
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


def step_columns(steps: Sequence[StepRow], started_at: datetime, max_points: int) -> dict[str, Any]:
    """Steps as columns (``version``, ``wall_s`` since ``started_at``, ``samples_trained`` and every
    ``STEP_COLUMNS``), at most ``max_points`` rows, chosen so that each shaped column keeps its extremes."""
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
    columns["total_steps"] = len(steps)
    columns["returned_steps"] = len(chosen)
    return columns


def lag_heatmap(records: Sequence[Mapping[str, Any]], max_steps: int) -> dict[str, Any]:
    """Mean lag by token-position bucket (rows) and step (columns), from trainer records that carry
    ``lag/by_position``; at most ``max_steps`` evenly spread steps, always the newest."""
    usable = [r for r in records if isinstance(r.get("lag/by_position"), list)]
    if len(usable) > max_steps:
        stride = len(usable) / max_steps
        picked = sorted({int(i * stride) for i in range(max_steps - 1)} | {len(usable) - 1})
        usable = [usable[i] for i in picked]
    buckets = max((len(r["lag/by_position"]) for r in usable), default=0)
    bucket_size = next(
        (int(r["lag/position_bucket_size"]) for r in usable if "lag/position_bucket_size" in r), 1
    )
    values = [
        [r["lag/by_position"][b] if b < len(r["lag/by_position"]) else None for r in usable]
        for b in range(buckets)
    ]
    return {
        "versions": [int(r["policy_version"]) for r in usable],
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
) -> dict[str, Any]:
    """The three stages as the run page draws them: the actor's tokens/s and idle fraction since its
    previous weight update and the rollouts queued at the preprocessor (the latest values), then over
    the last ``STAGE_WINDOW`` records the preprocessor's delivery rate and the share of time it held
    batches back for the trainer, the batches sent ahead of the trainer, and the trainer's tokens/s
    and idle fraction (its step and wait seconds)."""
    busy_s = sum((s.values["step_s"] or 0.0) + (s.values["wait_s"] or 0.0) for s in recent_steps)
    waited_s = sum(s.values["wait_s"] or 0.0 for s in recent_steps)
    tokens = sum(s.values["tokens"] or 0 for s in recent_steps)
    last_sent = preprocessor_records[-1] if preprocessor_records else None
    return {
        "actor": {"tokens_per_s": actor_tokens_per_s, "idle_fraction": actor_idle},
        "rollout_queue": rollout_queue,
        "preprocessor": {
            "batches_sent": None if last_sent is None else int(last_sent.get("step", -1)) + 1,
            "samples_per_s": _samples_per_s(recent_steps),
            "held_fraction": _held_fraction(preprocessor_records[-(STAGE_WINDOW + 1) :]),
        },
        "batches_ahead": None
        if last_sent is None
        else max(0, int(last_sent.get("step", 0)) - int(last_sent.get("trainer_version", 0))),
        "trainer": {
            "tokens_per_s": round(tokens / busy_s, 3) if busy_s > 0 else None,
            "idle_fraction": round(waited_s / busy_s, 4) if busy_s > 0 else None,
        },
    }


def _samples_per_s(steps: Sequence[StepRow]) -> float | None:
    """Samples the trainer received per second over the steps (what the preprocessor delivered)."""
    if len(steps) < 2:
        return None
    elapsed = (steps[-1].created_at - steps[0].created_at).total_seconds()
    samples = sum(s.values["samples"] or 0 for s in steps[1:])
    return round(samples / elapsed, 3) if elapsed > 0 else None


def _held_fraction(records: Sequence[Mapping[str, Any]]) -> float | None:
    """The share of the time between the first and last record that the preprocessor held finished
    batches back because the trainer was behind (``preprocessor/held_s``)."""
    if len(records) < 2:
        return None
    elapsed = float(records[-1]["time"]) - float(records[0]["time"])
    held = sum(float(r.get("preprocessor/held_s", 0.0)) for r in records[1:])
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
    default the highest such reward that every run reached), and for each baseline (the
    conventional runs; the first run if none is) the ratio ``baseline's time / this run's time``:
    above 1 this run got there faster. Also mean ESS and lag."""
    records = {
        run.run_id: [{"rl/reward_mean": reward} for reward in run.rewards] for run in runs if run.rewards
    }
    goal = target if target is not None else (default_target(records, window) if records else None)
    baselines = [run for run in runs if run.mode in BASELINE_MODES] or list(runs[:1])
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
        speedups = {}
        for baseline in baselines:
            base = reached[baseline.run_id]
            speedups[baseline.label] = (
                round(base[0] / hit[0], 3) if hit is not None and base is not None and hit[0] > 0 else None
            )
        rows.append(
            {
                "run_id": run.run_id,
                "label": run.label,
                "mode": run.mode,
                "time_to_target_s": None if hit is None else round(hit[0], 3),
                "samples_to_target": None if hit is None else hit[1],
                "speedup_vs": speedups,
                "ess_mean": _mean(run.ess),
                "lag_mean": _mean(run.lag_mean),
                "lag_max": max((v for v in run.lag_max if v is not None), default=None),
                "steps": len(run.rewards),
            }
        )
    return {
        "target": goal,
        "window": window,
        "baselines": [baseline.label for baseline in baselines],
        "ratio": "speedup_vs[B] = B's time to target / this run's time to target (> 1: this run is faster)",
        "rows": rows,
    }


def _mean(values: Sequence[float | int | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return round(sum(present) / len(present), 6) if present else None
