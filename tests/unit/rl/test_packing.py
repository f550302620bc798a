"""Micro-batch packing and padding: hand examples and invariants over random lengths."""

import random

import pytest
import torch

from pipelinerl.rl.packing import pack_micro_batches
from pipelinerl.rl.padding import pad_micro_batch


def test_hand_example() -> None:
    # longest first: 1(50), 3(50) cost 100; then 2(20), 0(10), 4(5) cost 3 * 20 = 60
    assert pack_micro_batches([10, 50, 20, 50, 5], max_tokens_per_micro_batch=100) == [[1, 3], [2, 0, 4]]


def test_oversize_sequence_gets_its_own_micro_batch() -> None:
    assert pack_micro_batches([10, 300, 10], max_tokens_per_micro_batch=100) == [[1], [0, 2]]
    assert pack_micro_batches([300, 200], max_tokens_per_micro_batch=100) == [[0], [1]]


def test_ties_keep_index_order() -> None:
    assert pack_micro_batches([5, 5, 5], max_tokens_per_micro_batch=10) == [[0, 1], [2]]


def test_empty_input() -> None:
    assert pack_micro_batches([], max_tokens_per_micro_batch=10) == []


def test_invariants_on_random_lengths() -> None:
    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.randint(1, 400) for _ in range(rng.randint(1, 60))]
        budget = rng.randint(1, 1200)
        micro_batches = pack_micro_batches(lengths, budget)

        assert sorted(index for batch in micro_batches for index in batch) == list(range(len(lengths)))
        for batch in micro_batches:
            cost = len(batch) * max(lengths[index] for index in batch)
            assert cost <= budget or len(batch) == 1
        assert pack_micro_batches(list(lengths), budget) == micro_batches


@pytest.mark.parametrize(
    ("lengths", "budget", "message"),
    [([3], 0, "max_tokens_per_micro_batch must be >= 1, got 0"), ([3, 0], 10, "length 0 at index 1")],
)
def test_rejects_bad_inputs(lengths: list[int], budget: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pack_micro_batches(lengths, budget)


def test_pad_micro_batch_right_pads() -> None:
    input_ids, attention_mask = pad_micro_batch([[1, 2, 3], [4]], pad_value=-7)
    assert input_ids.dtype == torch.int64
    assert attention_mask.dtype == torch.bool
    assert input_ids.tolist() == [[1, 2, 3], [4, -7, -7]]
    assert attention_mask.tolist() == [[True, True, True], [True, False, False]]


def test_pad_micro_batch_rejects_empty() -> None:
    with pytest.raises(ValueError, match="at least one sequence"):
        pad_micro_batch([], pad_value=0)
