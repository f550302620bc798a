"""The dashboard's numbers: heartbeat, step columns, the lag heat map, the comparison table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pipelinerl.ui.queries import STEP_COLUMNS, StepRow
from pipelinerl.ui.series import (
    STALE_AFTER_S,
    ComparedRun,
    comparison_table,
    lag_heatmap,
    run_state,
    stage_boxes,
    step_columns,
    training_started_at,
)

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def step(version: int, seconds: float, **values: float | None) -> StepRow:
    full: dict[str, float | None] = {name: None for name in STEP_COLUMNS}
    full.update(values)
    return StepRow(version, START + timedelta(seconds=seconds), 16 * version, full)


def test_a_running_run_without_recent_steps_is_silent() -> None:
    now = START + timedelta(seconds=STALE_AFTER_S + 60)
    assert run_state("running", START, START + timedelta(seconds=30), now).silent
    assert not run_state("running", START, now - timedelta(seconds=5), now).silent
    assert not run_state("finished", START, START, now).silent, "only running runs can be silent"
    assert run_state("running", START, None, START + timedelta(seconds=12)).heartbeat_age_s == 12
    # With the launcher's heartbeat (every 10 s), silence shows after HEARTBEAT_STALE_S (30 s), steps or not.
    beat = now - timedelta(seconds=20)
    assert not run_state("running", START, START, now, heartbeat_at=beat).silent
    assert run_state("running", START, START, now, heartbeat_at=now - timedelta(seconds=121)).silent


def test_wall_time_starts_when_the_trainer_began_waiting_for_its_first_batch() -> None:
    steps = [step(1, 30.0, step_s=1.5, wait_s=3.5), step(2, 32.0, step_s=1.5, wait_s=0.5)]
    assert training_started_at(steps, START) == START + timedelta(seconds=25)
    assert training_started_at([], START) == START
    columns = step_columns(steps, training_started_at(steps, START), 100)
    assert columns["wall_s"] == [5.0, 7.0]
    assert columns["samples_trained"] == [16, 32]
    assert columns["version"] == [1, 2] and columns["total_steps"] == 2


def test_step_columns_are_downsampled_to_the_budget() -> None:
    steps = [step(v, 2.0 * v, reward_mean=0.5, ess=0.9, lag_max=1) for v in range(1, 5001)]
    columns = step_columns(steps, START, 100)
    assert columns["returned_steps"] == len(columns["version"]) <= 100
    assert columns["total_steps"] == 5000
    assert columns["version"][0] == 1 and columns["version"][-1] == 5000


def test_lag_heatmap_keeps_the_newest_step_and_the_bucket_positions() -> None:
    records = [
        {
            "policy_version": v,
            "lag/by_position": [1.0, 0.5, None][: 1 + v % 3],
            "lag/position_bucket_size": 32,
        }
        for v in range(1, 501)
    ]
    heat = lag_heatmap(records, max_steps=50)
    assert len(heat["versions"]) <= 50 and heat["versions"][-1] == 500
    assert heat["position_start"] == [0, 32, 64]
    assert len(heat["mean_lag"]) == 3 and all(len(row) == len(heat["versions"]) for row in heat["mean_lag"])
    assert lag_heatmap([], 10)["mean_lag"] == []


def compared(run_id: str, mode: str, rewards: list[float], seconds_per_step: float) -> ComparedRun:
    steps = range(1, len(rewards) + 1)
    return ComparedRun(
        run_id=run_id,
        label=mode,
        mode=mode,
        rewards=rewards,
        wall_s=[seconds_per_step * s for s in steps],
        samples=[16 * s for s in steps],
        ess=[0.9] * len(rewards),
        lag_mean=[0.5] * len(rewards),
        lag_max=[2.0] * len(rewards),
    )


def test_the_ratio_is_the_baselines_time_over_this_runs_time() -> None:
    pipeline = compared("a", "pipeline", [0.0, 0.5, 1.0, 1.0], seconds_per_step=10.0)
    conventional = compared("b", "conventional", [0.0, 0.5, 1.0, 1.0], seconds_per_step=20.0)
    table = comparison_table([pipeline, conventional], target=0.5, window=1)
    assert table["baselines"] == ["conventional"]
    rows = {row["label"]: row for row in table["rows"]}
    assert rows["pipeline"]["time_to_target_s"] == 20.0
    assert rows["conventional"]["time_to_target_s"] == 40.0
    assert rows["pipeline"]["speedup_vs"] == {"conventional": 2.0}, "twice as fast: ratio 2"
    assert rows["conventional"]["speedup_vs"] == {"conventional": 1.0}
    assert rows["pipeline"]["samples_to_target"] == 32
    assert "> 1: this run is faster" in table["ratio"]


def test_a_run_that_never_reaches_the_target_has_no_time_and_no_ratio() -> None:
    pipeline = compared("a", "pipeline", [0.1, 0.2], seconds_per_step=1.0)
    conventional = compared("b", "conventional", [0.9, 0.9], seconds_per_step=1.0)
    rows = comparison_table([pipeline, conventional], target=0.8, window=1)["rows"]
    assert rows[0]["time_to_target_s"] is None and rows[0]["speedup_vs"] == {"conventional": None}


def test_the_default_target_is_the_best_reward_every_run_reached() -> None:
    table = comparison_table(
        [compared("a", "pipeline", [0.2, 0.6], 1.0), compared("b", "async", [0.1, 0.4], 1.0)], window=1
    )
    assert table["target"] == pytest.approx(0.4)
    assert table["baselines"] == ["pipeline"], "without a conventional run, the first run is the baseline"


def test_stage_boxes_from_the_newest_records() -> None:
    recent = [step(v, 2.0 * v, step_s=1.5, wait_s=0.5, tokens=400, samples=16) for v in range(1, 6)]
    sent = [
        {"step": 5, "trainer_version": 4, "time": 100.0, "preprocessor/held_s": 0.0},
        {"step": 6, "trainer_version": 4, "time": 104.0, "preprocessor/held_s": 1.0},
    ]
    boxes = stage_boxes(
        recent,
        actor_tokens_per_s=700.0,
        actor_idle=0.3,
        rollout_queue=7.0,
        preprocessor_records=sent,
    )
    assert boxes["actor"] == {"tokens_per_s": 700.0, "idle_fraction": 0.3}
    assert boxes["rollout_queue"] == 7.0
    assert boxes["batches_ahead"] == 2, "batch 6 sent while the trainer is at version 4"
    assert boxes["preprocessor"] == {"batches_sent": 7, "samples_per_s": 8.0, "held_fraction": 0.25}
    assert boxes["trainer"] == {"tokens_per_s": 200.0, "idle_fraction": 0.25}
    empty = stage_boxes(
        [], actor_tokens_per_s=None, actor_idle=None, rollout_queue=None, preprocessor_records=[]
    )
    assert empty["actor"]["tokens_per_s"] is None and empty["batches_ahead"] is None
