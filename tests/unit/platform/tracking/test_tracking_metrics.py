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
