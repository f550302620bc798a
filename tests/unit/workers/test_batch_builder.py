"""The preprocessor's pure logic: groups scored by the verifier, leave-one-out advantages, batches."""

from __future__ import annotations

import numpy as np
import pytest

from pipelinerl.platform.wire import Rollout
from pipelinerl.tasks import get_task
from pipelinerl.workers.preprocessor import BatchBuilder


@pytest.fixture
def task():
    return get_task("arithmetic")


@pytest.fixture
def problems(task):
    return {p.problem_id: p for p in task.problems("train", 20, seed=0)}


def rollout(problem, group_id, index, text, group_size=4, completion_len=3):
    return Rollout(
        rollout_id=f"{group_id}-{index}",
        run_id="run",
        group_id=group_id,
        group_size=group_size,
        problem_id=problem.problem_id,
        split="train",
        actor_id=0,
        prompt_token_ids=np.array([1, 5, 6], dtype=np.int32),
        completion_token_ids=np.arange(completion_len, dtype=np.int32) + 7,
        behaviour_logprobs=np.full(completion_len, -0.5, dtype=np.float32),
        token_versions=np.zeros(completion_len, dtype=np.int32),
        finished=True,
        completion_text=text,
        created_at=0.0,
    )


def builder(task, problems, batch_size=8):
    return BatchBuilder(
        task=task, problems=problems, batch_size=batch_size, micro_batch_tokens=64, normalize_advantages=False
    )


def test_group_scored_with_leave_one_out_advantages(task, problems):
    problem = next(iter(problems.values()))
    right = task.reference_completion(problem)
    build = builder(task, problems, batch_size=4)
    texts = [right, "garbage", right, "A:-1"]
    batches = []
    for index, text in enumerate(texts):
        batches += build.add(rollout(problem, "g", index, text))
    assert len(batches) == 1
    sequences = batches[0].sequences
    assert [s.reward for s in sequences] == [1.0, 0.0, 1.0, 0.0]
    # A_i = R_i - mean of the other three: 1 - 1/3 and 0 - 2/3.
    assert [s.advantage for s in sequences] == pytest.approx([2 / 3, -2 / 3, 2 / 3, -2 / 3])
    assert sum(s.advantage for s in sequences) == pytest.approx(0.0, abs=1e-6)


def test_batches_hold_whole_groups_and_every_sequence_once(task, problems):
    build = builder(task, problems, batch_size=8)
    batches = []
    for g, problem in enumerate(list(problems.values())[:6]):
        for index in range(4):
            batches += build.add(rollout(problem, f"g{g}", index, "x", completion_len=2 + index))
    assert len(batches) == 3 and [b.batch_index for b in batches] == [0, 1, 2]
    ids = [s.rollout_id for b in batches for s in b.sequences]
    assert len(ids) == len(set(ids)) == 24
    for batch in batches:
        assert sorted(i for mb in batch.micro_batches for i in mb) == list(range(8))
        assert len({s.group_id for s in batch.sequences}) == 2


def test_incomplete_group_waits(task, problems):
    build = builder(task, problems, batch_size=4)
    problem = next(iter(problems.values()))
    assert build.add(rollout(problem, "g", 0, "x")) == []
    assert "g" in build.groups and build.ready == []


def test_duplicates_and_unknown_problems_are_counted_not_trained(task, problems):
    build = builder(task, problems, batch_size=4)
    problem = next(iter(problems.values()))
    first = rollout(problem, "g", 0, "x")
    build.add(first)
    build.add(first)
    other = get_task("arithmetic").problems("eval", 1, seed=0)[0]
    build.add(rollout(other, "h", 0, "x"))
    assert build.rejected == 2
    assert len(build.groups["g"]) == 1 and "h" not in build.groups
