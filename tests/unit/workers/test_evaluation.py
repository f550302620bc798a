"""In-run evaluation's pure parts: when a round is due, how a round closes into pass@1 / pass@k."""

from __future__ import annotations

import math

import pytest

from pipelinerl.platform.tracking.metrics import eval_metrics
from pipelinerl.tasks import Score
from pipelinerl.workers.evaluation import (
    EvalCollector,
    EvalSchedule,
    eval_group_id,
    parse_eval_group_id,
    pass_at_k,
)

RIGHT, WRONG, NONE = Score(1.0, "correct"), Score(0.0, "wrong"), Score(0.0, "no_answer")


def test_a_round_is_due_once_per_multiple_of_every() -> None:
    schedule = EvalSchedule(every=5, start_version=0)
    assert [v for v in range(0, 21) if schedule.due(v)] == [5, 10, 15, 20]
    jumpy = EvalSchedule(every=5, start_version=3)  # resumed at version 3: rounds at 8, 13, ...
    assert [jumpy.due(v) for v in (7, 8, 8, 20, 21)] == [False, True, False, True, False]
    assert not any(EvalSchedule(every=0, start_version=0).due(v) for v in range(50))


def test_group_ids_name_the_set_and_version() -> None:
    assert parse_eval_group_id(eval_group_id("heldout", 12)) == ("heldout", 12)
    assert parse_eval_group_id("0123abcd") is None


def test_pass_at_k_is_the_unbiased_estimate() -> None:
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - math.comb(7, 2) / math.comb(10, 2))
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_a_round_closes_when_its_last_sequence_arrives() -> None:
    collector = EvalCollector(samples=2)
    group = eval_group_id("heldout", 4)
    arrivals = [("p1", RIGHT, 10, False), ("p1", WRONG, 20, True), ("p2", NONE, 30, False)]
    assert all(collector.add(group, 4, *arrival) is None for arrival in arrivals)
    record = collector.add(group, 4, "p2", WRONG, 40, False)
    assert record is not None and not collector.rounds
    assert record["policy_version"] == 4 and record["set"] == "heldout" and record["problems"] == 2
    assert record["pass@1"] == pytest.approx(0.25)  # p1: 1/2, p2: 0/2
    assert record["pass@2"] == pytest.approx(0.5)  # p1 has a correct sample
    assert record["mean_length"] == 25 and record["mixed_version_fraction"] == 0.25
    assert record["labels"] == {"correct": 1, "wrong": 2, "no_answer": 1, "unparsable": 0}
    metrics = eval_metrics(record)
    assert metrics["eval/heldout/pass_at_1"] == pytest.approx(0.25)
    assert metrics["eval/heldout/pass_at_2"] == pytest.approx(0.5)
    assert metrics["eval/heldout/scores/no_answer"] == 1.0
