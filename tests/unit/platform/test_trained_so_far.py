"""What a checkpointed policy was trained on: rollout ids and prompt-stream positions, per rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelinerl.platform.checkpoint import (
    CheckpointError,
    TrainedSoFar,
    prompt_position,
    read_trained,
    train_group_id,
    write_trained,
)


def test_train_group_ids_carry_the_actor_and_the_stream_position() -> None:
    assert prompt_position(train_group_id(3, 41, "0123abcd")) == (3, 41)
    assert prompt_position("eval-default-v4") is None
    assert prompt_position("a1-p2-not_hex") is None


def test_every_rank_s_share_is_merged_positions_by_maximum(tmp_path: Path) -> None:
    rank0, rank1 = TrainedSoFar(), TrainedSoFar()
    rank0.add("r1", train_group_id(0, 4, "aa"))
    rank0.add("r2", train_group_id(1, 2, "bb"))
    rank1.add("r3", train_group_id(0, 9, "cc"))
    rank1.add("r4", "stranger-group")
    write_trained(tmp_path, 0, rank0)
    write_trained(tmp_path, 1, rank1)
    merged = read_trained(tmp_path)
    assert sorted(merged.rollout_ids) == ["r1", "r2", "r3", "r4"]
    assert merged.prompt_positions == {0: 10, 1: 3}


def test_a_checkpoint_without_the_files_knows_nothing_and_a_damaged_one_is_named(tmp_path: Path) -> None:
    assert read_trained(tmp_path) == TrainedSoFar()
    (tmp_path / "trained.rank0.json").write_text('{"rollout_ids": 3}')
    with pytest.raises(CheckpointError, match="trained.rank0.json"):
        read_trained(tmp_path)
