"""The dashboard's numbers: heartbeat, step columns and the reward's trailing mean, where evaluations
sit, the lag heat map, the comparison table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pipelinerl.platform.tracking.comparison import smoothed_rewards
from pipelinerl.ui.mlflow_reader import MetricPoint
from pipelinerl.ui.queries import STEP_COLUMNS, PolicyVersionRow, StepRow
from pipelinerl.ui.series import (
    STALE_AFTER_S,
    ComparedRun,
    comparison_table,
    eval_series,
    lag_heatmap,
    run_state,
    stage_boxes,
    step_columns,
    trainer_points,
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
    assert rows["pipeline"]["times_faster_than"] == {"conventional": 2.0}, "in half the time: 2x faster"
    assert rows["conventional"]["times_faster_than"] == {"conventional": 1.0}
    assert rows["pipeline"]["samples_to_target"] == 32
    assert "B's time to the target ÷ this run's" in table["meaning"]


def test_a_run_that_never_reaches_the_target_has_no_time_and_no_ratio() -> None:
    pipeline = compared("a", "pipeline", [0.1, 0.2], seconds_per_step=1.0)
    conventional = compared("b", "conventional", [0.9, 0.9], seconds_per_step=1.0)
    rows = comparison_table([pipeline, conventional], target=0.8, window=1)["rows"]
    assert rows[0]["time_to_target_s"] is None and rows[0]["times_faster_than"] == {"conventional": None}


def test_the_default_target_is_the_best_reward_every_run_reached() -> None:
    table = comparison_table(
        [compared("a", "pipeline", [0.2, 0.6], 1.0), compared("b", "async", [0.1, 0.4], 1.0)], window=1
    )
    assert table["target"] == pytest.approx(0.4)
    assert table["baselines"] == ["pipeline"], "without a conventional run, the first run is the baseline"


def test_the_reward_chart_draws_the_trailing_mean_the_time_to_target_is_read_from() -> None:
    rewards = [0.0, 0.6, 0.1, 0.5, 0.9, 0.2, 0.8, 0.7]
    steps = [step(v, 4.0 * v, reward_mean=r) for v, r in enumerate(rewards, start=1)]
    columns = step_columns(steps, START, 100, window=3)
    assert columns["reward_window"] == 3
    expected = smoothed_rewards([{"rl/reward_mean": r} for r in rewards], window=3)
    assert columns["reward_trailing_mean"] == pytest.approx(expected)
    assert columns["reward_trailing_mean"][:3] == pytest.approx([0.0, 0.3, 0.7 / 3])
    # Where the drawn trailing mean first reaches the target is the table's time to target.
    run = ComparedRun("a", "pipeline", "pipeline", rewards, columns["wall_s"], [16] * 8, [], [], [])
    [row] = comparison_table([run], target=0.5, window=3)["rows"]
    first = next(i for i, value in enumerate(columns["reward_trailing_mean"]) if value >= 0.5)
    assert row["time_to_target_s"] == columns["wall_s"][first] == 20.0  # (0.1 + 0.5 + 0.9) / 3 at step 5


def test_the_trailing_mean_is_over_every_step_before_downsampling() -> None:
    steps = [step(v, 1.0 * v, reward_mean=float(v % 2), ess=0.9, lag_max=1) for v in range(1, 1001)]
    columns = step_columns(steps, START, 50)
    assert columns["returned_steps"] <= 50
    full = smoothed_rewards([{"rl/reward_mean": float(v % 2)} for v in range(1, 1001)])
    by_version = dict(zip(range(1, 1001), full, strict=True))
    assert columns["reward_trailing_mean"] == pytest.approx([by_version[v] for v in columns["version"]])


def test_evaluations_sit_where_their_policy_was_trained_not_when_they_were_logged() -> None:
    # A conventional run: 8 steps, 29 s of training from START; the final evaluation of version 8 was
    # logged at 63 s, the in-run one of version 4 at 20 s, the start's before training.
    wall = [2.0, 4.0, 6.0, 14.5, 17.0, 19.0, 21.0, 29.0]
    steps = [step(v, wall[v - 1], samples=16) for v in range(1, 9)]
    logged = lambda version, at: MetricPoint(version, (START + timedelta(seconds=at)).timestamp(), 0.5)  # noqa: E731
    histories = {
        "eval/success": [logged(0, -30.0), logged(8, 63.0)],
        "eval/heldout/pass_at_1": [logged(4, 20.0), logged(9, 70.0)],
    }
    [heldout, success] = eval_series(histories, trainer_points(steps, START))
    assert success["name"] == "eval/success"
    assert success["version"] == [0, 8]
    assert success["wall_s"] == [0.0, 29.0], "the final evaluation at 29 s, where version 8 was trained"
    assert success["samples_trained"] == [0, 128]
    assert heldout["version"] == [4] and heldout["wall_s"] == [14.5], "version 9 has no step yet"
    # Policy versions (the run page's live view) place them the same way as steps.
    versions = [PolicyVersionRow(s.version, s.created_at, 16 * s.version, 0, None, None, None) for s in steps]
    assert eval_series(histories, trainer_points(versions, START)) == [heldout, success]


def test_stage_boxes_from_the_newest_records() -> None:
    recent = [step(v, 2.0 * v, step_s=1.5, wait_s=0.5, tokens=400, samples=16) for v in range(1, 6)]
    sent = [
        {"step": 5, "trainer_version": 4, "time": 100.0, "preprocessor/held_s": 0.0},
        {"step": 6, "trainer_version": 4, "time": 104.0, "preprocessor/held_s": 1.0},
    ]
    by_actor = [{"actor_id": 0, "tokens_per_s": 300.0}, {"actor_id": 1, "tokens_per_s": 400.0}]
    boxes = stage_boxes(
        recent,
        actor_tokens_per_s=700.0,
        actor_idle=0.3,
        rollout_queue=7.0,
        preprocessor_records=sent,
        by_actor=by_actor,
    )
    assert boxes["actor"]["tokens_per_s"] == 700.0 and boxes["actor"]["idle_fraction"] == 0.3
    assert boxes["actor"]["by_actor"] == by_actor
    assert boxes["actor"]["units"] == {"tokens_per_s": "tokens/s", "idle_fraction": "fraction"}
    assert boxes["rollout_queue"] == 7.0
    assert boxes["batches_ahead"] == 2, "batch 6 sent while the trainer is at version 4"
    assert boxes["preprocessor"] == {"batches_sent": 7, "samples_per_s": 8.0, "held_fraction": 0.25}
    trainer = boxes["trainer"]
    assert (trainer["tokens_per_s"], trainer["idle_fraction"]) == (200.0, 0.25)
    assert trainer["metrics"] == {
        "tokens_per_s": "throughput/trainer_tokens_per_s",
        "idle_fraction": "trainer/idle_fraction",
    }
    # A broadcast after each step is busy time, as in MLflow's trainer/idle_fraction: 5 x (1.5 + 0.5 + 2) s.
    broadcasting = [
        step(v, 4.0 * v, step_s=1.5, wait_s=0.5, tokens=400, broadcast_ms=2000.0) for v in range(1, 6)
    ]
    boxes = stage_boxes(
        broadcasting, actor_tokens_per_s=None, actor_idle=None, rollout_queue=None, preprocessor_records=[]
    )
    assert (boxes["trainer"]["tokens_per_s"], boxes["trainer"]["idle_fraction"]) == (100.0, 0.125)
    empty = stage_boxes(
        [], actor_tokens_per_s=None, actor_idle=None, rollout_queue=None, preprocessor_records=[]
    )
    assert empty["actor"]["tokens_per_s"] is None and empty["batches_ahead"] is None
