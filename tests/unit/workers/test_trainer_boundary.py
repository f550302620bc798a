"""The trainer's boundary: sequences it cannot train are dropped from their batch and counted."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import msgspec
import numpy as np
import pytest
import torch

from pipelinerl.platform.prompt_records import REJECTED_BY_TRAINER, trainer_dropped_path
from pipelinerl.platform.wire import TrainBatch
from pipelinerl.workers.policy_step import per_token
from pipelinerl.workers.trainer import Trainer, model_positions
from tests.unit.platform.test_wire import make_sequence


def _trainer(run_dir: Path, **fields: object) -> SimpleNamespace:
    """What ``Trainer.admissible`` reads of its trainer: counts and limits, where it writes its
    refusals; no model."""
    defaults = {"rejected": 0, "policy_version": 0, "vocab_size": 1000, "rank": 0}
    refusals = trainer_dropped_path(run_dir, 0)
    return SimpleNamespace(
        **{
            **defaults,
            "max_completion_tokens": None,
            "max_sequence_tokens": None,
            "refusals": refusals,
            **fields,
        }
    )


def test_sequences_outside_the_vocabulary_or_from_the_future_are_dropped_and_counted(tmp_path: Path) -> None:
    # make_sequence(i, n): versions i, token ids around 100 + i
    sequences = [make_sequence(0, 2), make_sequence(1, 3), make_sequence(2, 2), make_sequence(0, 1)]
    sequences[3].completion_token_ids = np.array([10**6], dtype=np.int32)  # beyond the vocabulary
    batch = TrainBatch(batch_index=5, sequences=sequences, micro_batches=[[0, 3], [1, 2]], created_at=1.0)
    trainer = _trainer(tmp_path, policy_version=1, vocab_size=1000)  # version 2 is the future
    kept = Trainer.admissible(trainer, batch)  # type: ignore[arg-type]
    assert [s.rollout_id for s in kept.sequences] == ["rollout-0", "rollout-1"]
    assert kept.micro_batches == [[0], [1]]
    assert trainer.rejected == 2
    assert Trainer.admissible(trainer, kept) is kept and trainer.rejected == 2  # nothing more to drop
    # Each refusal is also kept by its prompt's group, for `pipelinerl runs audit`.
    refused = [json.loads(line) for line in trainer_dropped_path(tmp_path, 0).read_text().splitlines()]
    assert [(r["group_id"], r["reason"], r["policy_version"]) for r in refused] == [
        (sequences[2].group_id, REJECTED_BY_TRAINER, 2),
        (sequences[3].group_id, REJECTED_BY_TRAINER, 2),
    ]
    assert "newer" in refused[0]["detail"] or "version" in refused[0]["detail"]


def test_empty_prompts_and_sequences_beyond_the_model_or_the_actor_are_dropped_and_counted(
    tmp_path: Path,
) -> None:
    sequences = [make_sequence(0, 2), make_sequence(0, 3), make_sequence(0, 4), make_sequence(0, 2)]
    sequences[1] = msgspec.structs.replace(sequences[1], prompt_token_ids=np.array([], dtype=np.int32))
    # sequences[2]: 3 prompt + 4 completion tokens, beyond the model's 6 positions
    sequences[3] = msgspec.structs.replace(sequences[3], rollout_id="rollout-3")
    batch = TrainBatch(batch_index=1, sequences=sequences, micro_batches=[[0, 1], [2, 3]], created_at=1.0)
    # Before: the empty prompt reached the loss, whose scatter of per-token values failed.
    with pytest.raises(RuntimeError):
        per_token([sequences[1]], torch.ones(1, 3, dtype=torch.bool), "behaviour_logprobs", torch.float32)
    trainer = _trainer(tmp_path, max_sequence_tokens=6, max_completion_tokens=3)
    kept = Trainer.admissible(trainer, batch)  # type: ignore[arg-type]
    assert [s.rollout_id for s in kept.sequences] == ["rollout-0", "rollout-3"]
    assert kept.micro_batches == [[0], [1]] and trainer.rejected == 2
    # the actor's limit alone: a 4-token completion where actors write at most 3
    trainer = _trainer(tmp_path, max_sequence_tokens=None, max_completion_tokens=3)
    assert len(Trainer.admissible(trainer, batch).sequences) == 2 and trainer.rejected == 2  # type: ignore[arg-type]


def test_the_position_limit_is_read_from_the_model_config() -> None:
    assert model_positions(SimpleNamespace(max_position_embeddings=2048)) == 2048
    assert model_positions(SimpleNamespace(n_positions=1024)) == 1024
    assert model_positions(SimpleNamespace()) is None
