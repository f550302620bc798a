"""How far ahead of the trainer the preprocessor may hand out batches (``TrainerProgress``)."""

from __future__ import annotations

import pytest

from pipelinerl.platform.config import load_config
from pipelinerl.workers.preprocessor import TrainerProgress, steps_ahead_allowed


@pytest.mark.parametrize(
    ("overrides", "allowed"),
    [
        ([], 2),
        (["transport.batches_ahead=1"], 1),
        (["run.mode=async"], 2),
        (["run.mode=conventional", "run.steps_per_round=4"], 5),  # a whole round, published once
    ],
)
def test_steps_ahead_allowed(overrides, allowed):
    assert steps_ahead_allowed(load_config(None, overrides)) == allowed


def test_a_batch_waits_until_the_trainer_is_close_enough():
    progress = TrainerProgress(start_version=0, steps_ahead=2)
    assert progress.may_send(0) and progress.may_send(1)
    assert not progress.may_send(2), "step 2 would be the second batch waiting behind the trained one"
    progress.version = 1
    assert progress.may_send(2) and not progress.may_send(3)


def test_a_resumed_run_counts_steps_from_its_checkpoint():
    progress = TrainerProgress(start_version=40, steps_ahead=1)
    assert progress.version == 40
    assert progress.may_send(0) and not progress.may_send(1)
    progress.version = 41
    assert progress.may_send(1)
