"""A what-if replay's ``rl.max_lag`` drops what the preprocessor would have dropped, and a step's seed
depends on the run's seed and the step's version alone (``workers/replay.py``, ``workers/trainer.py``)."""

from __future__ import annotations

import numpy as np

from pipelinerl.platform.wire import TrainBatch
from pipelinerl.workers.replay import within_max_lag
from pipelinerl.workers.trainer import step_seed
from tests.unit.platform.test_wire import make_sequence


def test_sequences_older_than_max_lag_are_dropped_and_micro_batches_renumbered() -> None:
    # make_sequence(i, n): n tokens, all sampled by version i
    sequences = [make_sequence(3, 2), make_sequence(1, 2), make_sequence(2, 3), make_sequence(0, 1)]
    sequences[2].token_versions = np.array([2, 3, 3], dtype=np.int32)  # in flight during an update
    batch = TrainBatch(batch_index=4, sequences=sequences, micro_batches=[[0, 1], [2, 3]], created_at=1.0)
    assert within_max_lag(batch, trained_at=3, max_lag=None) is batch
    kept = within_max_lag(batch, trained_at=3, max_lag=1)  # lags 0, 2, 1 (its oldest token), 3
    assert [s.rollout_id for s in kept.sequences] == ["rollout-3", "rollout-2"]
    assert kept.micro_batches == [[0], [1]]
    assert within_max_lag(batch, trained_at=3, max_lag=3) is batch
    assert within_max_lag(batch, trained_at=4, max_lag=0).sequences == []


def test_a_step_seed_depends_on_the_run_seed_and_the_version_alone() -> None:
    assert step_seed(0, 5) == step_seed(0, 5)
    seeds = {step_seed(seed, version) for seed in range(4) for version in range(100)}
    assert len(seeds) == 400 and all(0 <= seed < 2**63 for seed in seeds)
