"""``rl/behaviour_mismatch`` in a real run: the trainer's value equals a numpy recomputation.

The metric is the mean |trainer log-prob - behaviour log-prob| over a step's lag-0 tokens (same
weights on both sides, ``pipelinerl/rl/mismatch.py``). ``check_behaviour_mismatch`` recomputes it
from the per-token data the trainer saved for the same step. The run it is checked on is one that
``test_pipeline.py`` launches anyway (its pipeline-mode run:
``test_pipeline.py::test_behaviour_mismatch_is_recorded_and_tracked``, which also checks that MLflow
has the values); the vLLM runs (``test_vllm_pipeline.py``) call it too.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipelinerl.platform.tracking import metric_registry as metric

KEY = metric.BEHAVIOUR_MISMATCH


def check_behaviour_mismatch(result, ranks: int = 1) -> list[float]:
    """Every record's mismatch against the step's npz (absent exactly when no token has lag 0);
    returns the values of the steps that had one."""
    values = []
    for record in result.records:
        version = record["policy_version"]
        parts = [
            np.load(result.run_dir / "tokens" / f"step_{version:06d}_rank{rank}.npz") for rank in range(ranks)
        ]
        trainer = np.concatenate([p["trainer_logprobs"].astype(np.float64) for p in parts])
        behaviour = np.concatenate([p["behaviour_logprobs"].astype(np.float64) for p in parts])
        lags = int(parts[0]["trained_at_version"]) - np.concatenate([p["token_versions"] for p in parts])
        same_weights = lags == 0
        if not same_weights.any():
            assert KEY not in record, version
            continue
        expected = np.abs(trainer - behaviour)[same_weights].mean()
        assert record[KEY] == pytest.approx(expected, rel=1e-6, abs=1e-9), version
        values.append(record[KEY])
    assert values, "no step had a lag-0 token"
    return values
