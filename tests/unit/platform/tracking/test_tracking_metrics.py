"""The stage records -> MLflow metrics mapping (names from ``metric_registry``): what passes, under
which name, and the actors as a label."""

from __future__ import annotations

import pytest

from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.tracking.metrics import (
    actor_metrics,
    all_actors_metrics,
    eval_metrics,
    preprocessor_metrics,
    trainer_metrics,
)
from pipelinerl.platform.tracking.run_tracker import unreachable

RECORD = {
    "rl/loss": 0.5,
    "rl/ess": 0.99,
    "trainer/step_s": 1.5,
    "trainer/wait_s": 0.5,
    "trainer/tokens": 400,
}


def test_behaviour_mismatch_is_a_declared_metric_of_the_trainer_record():
    assert registry.declaration("rl/behaviour_mismatch").mlflow
    metrics = trainer_metrics({**RECORD, "rl/behaviour_mismatch": 2.5e-7})
    assert metrics["rl/behaviour_mismatch"] == pytest.approx(2.5e-7)
    assert metrics["trainer/idle_fraction"] == pytest.approx(0.25)
    assert metrics["throughput/trainer_tokens_per_s"] == pytest.approx(200.0)


def test_the_broadcast_is_busy_time_in_the_logged_trainer_statistics():
    metrics = trainer_metrics({**RECORD, "weights/broadcast_ms": 2000.0})  # a 2 s broadcast: 4 s cycle
    assert metrics["throughput/trainer_tokens_per_s"] == pytest.approx(100.0)
    assert metrics["trainer/idle_fraction"] == pytest.approx(0.125)
    assert metrics["weights/broadcast_ms"] == 2000.0


def test_a_step_without_lag_zero_tokens_logs_no_mismatch():
    assert "rl/behaviour_mismatch" not in trainer_metrics(RECORD)


def test_refusals_truncated_ess_and_lengths_reach_the_tracked_metrics():
    trainer = trainer_metrics(
        {**RECORD, "rl/ess_truncated": 0.97, "trainer/rejected": 3, "completion/len_p90": 40.0}
    )
    assert trainer["rl/ess_truncated"] == pytest.approx(0.97) and trainer["trainer/rejected"] == 3.0
    assert trainer["completion/len_p90"] == 40.0
    assert "trainer/step_s" not in trainer and "trainer/tokens" not in trainer, "record-only keys"
    counts = {
        "preprocessor/malformed": 8790,
        "preprocessor/rejected": 1313,
        "preprocessor/peer_disconnects": 3,
        "scores/correct": 5,
        "samples/dropped_stale": 2,
    }
    assert preprocessor_metrics({"queue/rollouts": 2, "step": 4, "preprocessor/held_s": 0.1, **counts}) == {
        "queue/rollouts": 2.0,
        **counts,
    }
    for name in ("rl/ess_truncated", "trainer/rejected", "completion/len_p90", *counts, "actor/malformed"):
        assert registry.declaration(name) is not None, name


def test_an_actor_is_a_label_of_its_metrics_and_the_plain_names_are_all_actors():
    zero = {"actor_id": 0, "throughput/actor_tokens_per_s": 300.0, "actor/idle_fraction": 0.2}
    one = {
        "actor_id": 1,
        "throughput/actor_tokens_per_s": 500.0,
        "actor/idle_fraction": 0.4,
        "actor/malformed": 5,
    }
    assert actor_metrics(one) == {
        "actor/1/throughput/actor_tokens_per_s": 500.0,
        "actor/1/idle_fraction": 0.4,
        "actor/1/malformed": 5.0,
    }
    assert not any(key.startswith("actor1:") for key in actor_metrics(one))
    together = all_actors_metrics({0: zero, 1: one})
    assert together["throughput/actor_tokens_per_s"] == 800.0, "rates add up"
    assert together["actor/idle_fraction"] == pytest.approx(0.3), "fractions are averaged"
    assert together["actor/malformed"] == 5.0
    assert "actor/tokens_generated" not in together, "not an MLflow metric"


def test_an_eval_round_is_logged_under_its_set():
    record = {
        "set": "heldout",
        "policy_version": 4,
        "samples": 4,
        "pass@1": 0.5,
        "pass@4": 0.75,
        "mean_reward": 0.5,
        "mean_length": 12.0,
        "labels": {"correct": 8, "wrong": 8},
    }
    assert eval_metrics(record) == {
        "eval/heldout/pass_at_1": 0.5,
        "eval/heldout/pass_at_4": 0.75,
        "eval/heldout/mean_reward": 0.5,
        "eval/heldout/mean_length": 12.0,
        "eval/heldout/scores/correct": 8.0,
        "eval/heldout/scores/wrong": 8.0,
    }


def test_a_store_that_cannot_be_reached_is_told_from_one_that_refuses_a_write():
    assert unreachable(ConnectionRefusedError(111, "Connection refused"))
    try:
        try:
            raise ConnectionResetError("reset by peer")
        except ConnectionResetError as cause:
            raise RuntimeError("API request to http://127.0.0.1:5000 failed") from cause
    except RuntimeError as wrapped:
        assert unreachable(wrapped)
    assert unreachable(RuntimeError("Max retries exceeded with url: /api/2.0/mlflow/runs/log-batch"))
    assert not unreachable(PermissionError(13, "Permission denied: '/mlartifacts/1'"))
    assert not unreachable(RuntimeError("INVALID_PARAMETER_VALUE: artifact location mlflow-artifacts:/"))
