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


def test_the_positions_a_checkpoint_had_not_trained_are_known_across_ranks(tmp_path: Path) -> None:
    rank0, rank1 = TrainedSoFar(), TrainedSoFar()
    for position in (0, 1, 2, 5, 9):
        rank0.add(f"r{position}", train_group_id(0, position, "aa"))
    rank1.add("s3", train_group_id(0, 3, "bb"))  # a group split over the ranks: its positions join
    rank1.add("s10", train_group_id(0, 10, "cc"))
    rank1.add("t0", train_group_id(1, 1, "dd"))
    assert rank0.trained_positions == {0: [(0, 3), (5, 6), (9, 10)]}
    assert rank0.untrained_before(0) == [3, 4, 6, 7, 8]
    write_trained(tmp_path, 0, rank0)
    write_trained(tmp_path, 1, rank1)
    merged = read_trained(tmp_path)
    assert merged.prompt_positions == {0: 11, 1: 2}
    assert merged.untrained_before(0) == [4, 6, 7, 8]  # 3 trained on rank 1
    assert merged.untrained_before(1) == [0]
    assert merged.untrained_before(2) == []  # an actor that trained nothing yet


def test_a_checkpoint_from_before_the_positions_were_kept_hands_nothing_out_again(tmp_path: Path) -> None:
    (tmp_path / "trained.rank0.json").write_text('{"rollout_ids": ["r"], "prompt_positions": {"0": 7}}')
    old = read_trained(tmp_path)
    assert old.prompt_positions == {0: 7} and old.trained_positions is None
    assert old.untrained_before(0) == []
