"""The trainer's boundary: sequences it cannot train are dropped from their batch and counted."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from pipelinerl.platform.wire import TrainBatch
from pipelinerl.workers.trainer import Trainer
from tests.unit.platform.test_wire import make_sequence


def test_sequences_outside_the_vocabulary_or_from_the_future_are_dropped_and_counted() -> None:
    # make_sequence(i, n): versions i, token ids around 100 + i
    sequences = [make_sequence(0, 2), make_sequence(1, 3), make_sequence(2, 2), make_sequence(0, 1)]
    sequences[3].completion_token_ids = np.array([10**6], dtype=np.int32)  # beyond the vocabulary
    batch = TrainBatch(batch_index=5, sequences=sequences, micro_batches=[[0, 3], [1, 2]], created_at=1.0)
    trainer = SimpleNamespace(rejected=0, policy_version=1, vocab_size=1000)  # version 2 is the future
    kept = Trainer.admissible(trainer, batch)  # type: ignore[arg-type]
    assert [s.rollout_id for s in kept.sequences] == ["rollout-0", "rollout-1"]
    assert kept.micro_batches == [[0], [1]]
    assert trainer.rejected == 2
    assert Trainer.admissible(trainer, kept) is kept and trainer.rejected == 2  # nothing more to drop
