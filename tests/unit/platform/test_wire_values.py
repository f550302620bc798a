"""``wire.impossible_values``: well-formed sequences whose values no stage may train on."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pipelinerl.platform.wire import MalformedMessage, TrainBatch, decode, encode, impossible_values
from tests.unit.platform.test_wire import make_batch, make_sequence
from tests.unit.platform.test_wire import make_rollout as make_wire_rollout


def make_rollout(**overrides: Any) -> Any:
    return make_wire_rollout(**{"prompt_token_ids": np.array([101, 7], dtype=np.int32), **overrides})


def test_a_plausible_rollout_and_sequence_pass() -> None:
    assert impossible_values(make_rollout(), newest_version=4, vocab_size=102) is None
    assert impossible_values(make_sequence(2, 3), newest_version=2, vocab_size=200) is None
    assert impossible_values(make_rollout()) is None  # nothing given: only what is always impossible


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"completion_token_ids": np.array([5, -1, 0], dtype=np.int32)}, "completion_token_ids holds -1 < 0"),
        ({"prompt_token_ids": np.array([1, 50_000], dtype=np.int32)}, "outside the vocabulary of 32000"),
        ({"token_versions": np.array([3, 9, 4], dtype=np.int32)}, "9, newer than the newest policy v4"),
        ({"token_versions": np.array([3, -2, 4], dtype=np.int32)}, "token_versions holds -2 < 0"),
        ({"behaviour_logprobs": np.array([-1, np.nan, 0], dtype=np.float32)}, "not finite"),
        ({"behaviour_logprobs": np.array([-1, -np.inf, 0], dtype=np.float32)}, "not finite"),
        ({"behaviour_logprobs": np.array([-1, 0.5, 0], dtype=np.float32)}, "a probability above 1"),
    ],
)
def test_impossible_token_values_are_named(overrides: dict[str, Any], reason: str) -> None:
    assert reason in str(impossible_values(make_rollout(**overrides), newest_version=4, vocab_size=32_000))


def test_a_non_finite_reward_or_advantage_is_impossible() -> None:
    sequence = make_sequence(1, 2)
    sequence.advantage = float("inf")
    assert "not finite" in str(impossible_values(sequence))
    sequence.advantage, sequence.reward = 0.0, float("nan")
    assert "not finite" in str(impossible_values(sequence))


@pytest.mark.parametrize(
    ("micro_batches", "reason"),
    [([[0, 1], [1, 2]], "sequence 1 twice"), ([[0], [], [1, 2]], "empty micro-batch"), ([[0, 2]], "leave 1")],
    ids=["repeated", "empty", "missing"],
)
def test_micro_batches_must_hold_each_sequence_once(micro_batches, reason) -> None:
    # A repeated index trained a sequence twice in one step; a missing one counted it without training it.

    good = make_batch()
    frames = encode(good)
    assert decode(frames) == good
    with pytest.raises(ValueError, match=reason):
        TrainBatch(batch_index=0, sequences=good.sequences, micro_batches=micro_batches, created_at=0.0)
    forged = make_batch()
    forged.micro_batches = micro_batches  # assignment skips __post_init__, as a peer's own encoder would
    with pytest.raises(MalformedMessage, match=reason):
        decode(encode(forged))


def test_lengths_are_checked() -> None:
    empty = np.array([], dtype=np.int32)
    assert "prompt_token_ids is empty" in (impossible_values(make_rollout(prompt_token_ids=empty)) or "")
    assert impossible_values(make_rollout(), max_completion_tokens=3) is None
    assert "more than the 2 an actor writes" in (
        impossible_values(make_rollout(), max_completion_tokens=2) or ""
    )
    # 2 prompt + 3 completion tokens
    assert impossible_values(make_rollout(), max_sequence_tokens=5) is None
    assert "2 + 3 tokens, more than the model's 4" in (
        impossible_values(make_rollout(), max_sequence_tokens=4) or ""
    )
