"""The preprocessor's pure logic: groups scored by the verifier, leave-one-out advantages, batches."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from pipelinerl.platform.wire import Rollout
from pipelinerl.tasks import Score, get_task
from pipelinerl.workers.preprocessor import BatchBuilder, RewardPolicy


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


class _RaisingTask:
    """A user's scorer that blows up on one completion."""

    name = "raising"
    stop_strings = ()

    def __init__(self, inner) -> None:
        self.inner = inner

    def problems(self, split, count, seed):
        return self.inner.problems(split, count, seed)

    def score(self, problem, completion):
        if completion == "boom":
            raise RuntimeError("the scorer failed")
        return self.inner.score(problem, completion)


def test_every_score_label_is_counted_and_a_raising_scorer_gives_unparsable(task, problems):
    builder = BatchBuilder(
        task=_RaisingTask(task),
        problems=problems,
        batch_size=4,
        micro_batch_tokens=64,
        normalize_advantages=False,
    )
    problem = next(iter(problems.values()))
    texts = [f"A:{problem.answer}", "A:0" if problem.answer != "0" else "A:1", "no answer line", "boom"]
    (batch,) = [b for i, text in enumerate(texts) for b in builder.add(rollout(problem, "g", i, text))]
    assert [s.reward for s in batch.sequences] == [1.0, 0.0, 0.0, 0.0]
    assert dict(builder.labels) == {"correct": 1, "wrong": 1, "no_answer": 1, "unparsable": 1}


def test_truncated_completions_follow_rl_truncated() -> None:
    right = Score(1.0, "correct")
    assert RewardPolicy("train").reward(right, finished=False) == 1.0
    assert RewardPolicy("penalise", truncated_penalty=0.5).reward(right, finished=False) == -0.5
    assert RewardPolicy("penalise").reward(right, finished=True) == 1.0
    assert RewardPolicy("mask").advantage(0.7, finished=False) == 0.0
    assert RewardPolicy("mask").advantage(0.7, finished=True) == 0.7
    with_format = RewardPolicy(format_reward=0.1)
    assert with_format.reward(Score(0.0, "wrong"), True) == 0.1
    assert with_format.reward(Score(0.0, "no_answer"), True) == 0.0


def test_masked_truncated_sequences_keep_their_baseline_but_no_advantage(task, problems):
    build = builder(task, problems, batch_size=4)
    build.rewards = RewardPolicy("mask")
    problem = next(iter(problems.values()))
    right = task.reference_completion(problem)
    batches = []
    for index, text in enumerate([right, "x", right, "x"]):
        r = rollout(problem, "g", index, text)
        if index == 0:
            r = msgspec.structs.replace(r, finished=False)
        batches += build.add(r)
    (batch,) = batches
    assert [s.reward for s in batch.sequences] == [1.0, 0.0, 1.0, 0.0]
    assert [s.advantage for s in batch.sequences] == pytest.approx([0.0, -2 / 3, 2 / 3, -2 / 3])


def test_groups_with_equal_rewards_are_dropped_and_counted(task, problems):
    build = builder(task, problems, batch_size=4)
    build.drop_zero_variance_groups = True
    first, second = list(problems.values())[:2]
    for index in range(4):
        assert build.add(rollout(first, "same", index, "no answer")) == []
    assert build.dropped["zero_variance"] == 4 and build.buffered == 0
    right = task.reference_completion(second)
    batches = [
        b
        for i, text in enumerate([right, "x", "x", "x"])
        for b in build.add(rollout(second, "mixed", i, text))
    ]
    assert len(batches) == 1


def test_sequences_older_than_max_lag_at_their_step_are_dropped(task, problems):
    build = builder(task, problems, batch_size=4)
    build.max_lag, build.start_version = 1, 5  # the first batch trains at version 5
    problems_list = list(problems.values())
    batches = []
    # Group g0: sampled at version 3 (lag 2 at step 0: stale); g1 at version 4 (lag 1: kept), g2 at 5.
    for g, version in enumerate([3, 4, 5]):
        for index in range(4):
            r = rollout(problems_list[g], f"g{g}", index, "x", completion_len=2)
            r = msgspec.structs.replace(r, token_versions=np.full(2, version, dtype=np.int32))
            batches += build.add(r)
    assert build.dropped["stale"] == 4
    assert [{s.group_id for s in b.sequences} for b in batches] == [{"g1"}, {"g2"}]
    # The second batch trains at version 6: g2 (version 5) has lag 1 there, still within the bound.
