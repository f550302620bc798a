"""The trainer record -> MLflow metrics mapping: rl/behaviour_mismatch passes when present, only then."""

from __future__ import annotations

import pytest

from pipelinerl.platform.tracking.metrics import METRICS, trainer_metrics

RECORD = {
    "rl/loss": 0.5,
    "rl/ess": 0.99,
    "trainer/step_s": 1.5,
    "trainer/wait_s": 0.5,
    "tokens": 400,
}


def test_behaviour_mismatch_is_a_stable_metric_of_the_trainer_record():
    assert "rl/behaviour_mismatch" in METRICS
    metrics = trainer_metrics({**RECORD, "rl/behaviour_mismatch": 2.5e-7})
    assert metrics["rl/behaviour_mismatch"] == pytest.approx(2.5e-7)
    assert metrics["trainer/idle_fraction"] == pytest.approx(0.25)


def test_a_step_without_lag_zero_tokens_logs_no_mismatch():
    assert "rl/behaviour_mismatch" not in trainer_metrics(RECORD)


def test_refusals_truncated_ess_and_lengths_reach_the_tracked_metrics():
    from pipelinerl.platform.tracking.metrics import actor_metrics, preprocessor_metrics

    trainer = trainer_metrics(
        {**RECORD, "rl/ess_truncated": 0.97, "trainer/rejected": 3, "completion_len_p90": 40.0}
    )
    assert trainer["rl/ess_truncated"] == pytest.approx(0.97) and trainer["trainer/rejected"] == 3.0
    assert trainer["completion_len_p90"] == 40.0
    counts = {
        "preprocessor/malformed": 8790,
        "preprocessor/rejected": 1313,
        "preprocessor/peer_disconnects": 3,
    }
    assert preprocessor_metrics({"queue/rollouts": 2, **counts}) == {"queue/rollouts": 2.0, **counts}
    assert actor_metrics({"actor_id": 1, "actor/malformed": 5})["actor1:actor/malformed"] == 5.0
    for name in ("rl/ess_truncated", "trainer/rejected", "completion_len_p90", *counts, "actor/malformed"):
        assert name in METRICS


def test_a_store_that_cannot_be_reached_is_told_from_one_that_refuses_a_write():
    from pipelinerl.platform.tracking.run_tracker import unreachable

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
