"""The preprocessor's boundary: rollouts it must refuse (counted), and incomplete groups it must not keep
for ever."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from pipelinerl.platform.config import load_config
from pipelinerl.tasks import get_task
from pipelinerl.workers.preprocessor import BatchBuilder, build_batch_builder, incomplete_groups_bound
from tests.unit.workers.test_batch_builder import rollout


@pytest.fixture
def task():
    return get_task("arithmetic")


@pytest.fixture
def problems(task):
    return {p.problem_id: p for p in task.problems("train", 20, seed=0)}


def guarded_builder(task, problems, max_incomplete_groups=None):
    return BatchBuilder(
        task=task,
        problems=problems,
        batch_size=4,
        micro_batch_tokens=64,
        normalize_advantages=False,
        run_id="run",
        group_size=4,
        max_incomplete_groups=max_incomplete_groups,
    )


@pytest.mark.parametrize(
    "change",
    [
        {"run_id": "another-run"},
        {"group_size": 64},  # never completes here
        {"token_versions": np.array([0, 5, 0], dtype=np.int32)},  # newer than the trainer's v2
        {"behaviour_logprobs": np.array([-0.5, np.nan, -0.5], dtype=np.float32)},
        {"completion_token_ids": np.array([7, -3, 9], dtype=np.int32)},
    ],
    ids=["other-run", "group-size", "future-version", "nan-logprob", "negative-id"],
)
def test_impossible_rollouts_are_rejected_counted_and_never_batched(task, problems, change) -> None:
    problem = next(iter(problems.values()))
    build = guarded_builder(task, problems)
    for index in range(3):
        assert build.add(rollout(problem, "g", index, "x"), newest_version=2) == []
    bad = msgspec.structs.replace(rollout(problem, "g", 3, "x"), **change)
    assert build.add(bad, newest_version=2) == []
    assert build.rejected == 1 and build.buffered == 3
    # the group completes with a good fourth member
    [batch] = build.add(rollout(problem, "g", 4, "x"), newest_version=2)
    assert "g-3" not in [s.rollout_id for s in batch.sequences]


def test_a_member_that_disagrees_with_its_group_is_rejected(task, problems) -> None:
    first, second = list(problems.values())[:2]
    build = guarded_builder(task, problems)
    build.add(rollout(first, "g", 0, "x"))
    build.add(rollout(second, "g", 1, "x"))
    assert build.rejected == 1 and build.buffered == 1


def test_incomplete_groups_are_bounded_oldest_dropped_first_and_late_members_refused(task, problems) -> None:
    problem = next(iter(problems.values()))
    build = guarded_builder(task, problems, max_incomplete_groups=3)
    for group in range(1000):  # groups that never complete: e.g. a stranger's, one member each
        build.add(rollout(problem, f"lone{group}", 0, "x"))
    assert len(build.groups) == 3 and build.buffered == 3
    assert build.dropped["incomplete_group"] == 997
    assert list(build.groups) == ["lone997", "lone998", "lone999"]
    assert list(build.evicted) == ["lone994", "lone995", "lone996"]  # the last ones dropped are remembered
    build.add(rollout(problem, "lone996", 1, "x"))  # its group is gone: refused, not a new group
    assert build.rejected == 1 and "lone996" not in build.groups
    # complete groups still flow
    batches = [b for i in range(4) for b in build.add(rollout(problem, "whole", i, "x"))]
    assert len(batches) == 1


def test_the_bound_is_never_reached_by_a_healthy_run() -> None:
    config = load_config(None, ["actor.num_actors=2", "actor.max_in_flight=30", "rl.group_size=4"])
    groups_in_flight = 2 * -(-30 // 4)  # 16: each actor holds at most ceil(H / G) groups in flight
    assert incomplete_groups_bound(config) >= 4 * groups_in_flight


EMPTY = np.array([], dtype=np.int32)


def _emptied(r, *, prompt: bool, completion: bool):
    changes: dict = {}
    if prompt:
        changes["prompt_token_ids"] = EMPTY
    if completion:
        changes.update(
            completion_token_ids=EMPTY,
            behaviour_logprobs=np.array([], dtype=np.float32),
            token_versions=EMPTY,
        )
    return msgspec.structs.replace(r, **changes)


@pytest.mark.parametrize(
    ("prompt", "completion"),
    [(True, True), (True, False)],
    ids=["empty-prompt-and-completion", "empty-prompt"],
)
def test_a_group_of_empty_prompts_is_refused_and_counted_never_crashing_the_packer(
    task, problems, prompt, completion
) -> None:
    # Before: the group completed, and packing it raised "sequence lengths must be >= 1" (the stage died).
    problem = next(iter(problems.values()))
    build = guarded_builder(task, problems)
    for index in range(4):
        assert (
            build.add(_emptied(rollout(problem, "g", index, "x"), prompt=prompt, completion=completion)) == []
        )
    assert build.rejected == 4 and build.buffered == 0


def test_an_empty_completion_after_a_prompt_is_trained(task, problems) -> None:
    problem = next(iter(problems.values()))
    build = guarded_builder(task, problems)
    members = [_emptied(rollout(problem, "g", 0, ""), prompt=False, completion=True)]
    members += [rollout(problem, "g", index, "x") for index in (1, 2, 3)]
    batches = [batch for member in members for batch in build.add(member)]
    assert build.rejected == 0
    [batch] = batches
    assert sorted(len(s.completion_token_ids) for s in batch.sequences) == [0, 3, 3, 3]


def test_a_completion_longer_than_any_actor_writes_is_refused(task, problems) -> None:
    problem = next(iter(problems.values()))
    build = BatchBuilder(
        task=task,
        problems=problems,
        batch_size=4,
        micro_batch_tokens=64,
        normalize_advantages=False,
        max_completion_tokens=3,
    )
    assert build.add(rollout(problem, "g", 0, "x", completion_len=3)) == []
    assert build.add(rollout(problem, "g", 1, "x", completion_len=4)) == []
    assert build.rejected == 1 and build.buffered == 1


def test_the_preprocessor_takes_its_completion_limit_from_the_actor_setting(tmp_path, task, problems) -> None:
    config = load_config(None, ["actor.max_new_tokens=17"])
    assert build_batch_builder(config, tmp_path, task, problems).max_completion_tokens == 17
