"""Conventional rounds held until complete (``RoundBarrier``, ``run.train_during_round = false``)."""

from __future__ import annotations

import time

import pytest

from pipelinerl.platform.config import load_config
from pipelinerl.platform.wire import TrainBatch
from pipelinerl.workers.preprocessor import RoundBarrier, batches_per_round


def batch(index: int) -> TrainBatch:
    return TrainBatch(batch_index=index, sequences=[], micro_batches=[], created_at=time.time())


def test_a_round_is_released_only_when_all_its_batches_are_built():
    barrier = RoundBarrier(batches_per_round=3)
    assert barrier.add([batch(0)]) == []
    assert barrier.add([]) == []
    assert barrier.add([batch(1)]) == []
    released = barrier.add([batch(2), batch(3)])
    assert [b.batch_index for b in released] == [0, 1, 2], "the round, in order; batch 3 starts the next"
    assert [b.batch_index for b in barrier.held] == [3]
    assert [b.batch_index for b in barrier.add([batch(4), batch(5)])] == [3, 4, 5]
    assert barrier.held == []


def test_without_a_barrier_every_batch_passes_at_once():
    barrier = RoundBarrier(batches_per_round=1)
    assert [b.batch_index for b in barrier.add([batch(0)])] == [0]
    assert [b.batch_index for b in barrier.add([batch(1), batch(2)])] == [1, 2]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], 1),
        (["run.mode=conventional", "run.steps_per_round=4"], 1),  # default: train during the round
        (["run.mode=conventional", "run.steps_per_round=4", "run.train_during_round=false"], 4),
        (
            [
                "run.mode=conventional",
                "run.steps_per_round=4",
                "run.train_during_round=false",
                "trainer.num_processes=2",
            ],
            8,  # one shard per rank per step
        ),
        (["run.mode=pipeline", "run.train_during_round=false"], 1),  # only conventional has rounds
    ],
)
def test_batches_per_round_from_the_config(overrides, expected):
    assert batches_per_round(load_config(None, overrides)) == expected
