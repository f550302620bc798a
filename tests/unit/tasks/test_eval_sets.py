"""Named eval sets: the task's own held-out split and eval.sets, each the task built with its own options."""

from __future__ import annotations

import pytest

from pipelinerl.platform.config import ConfigError, load_config
from pipelinerl.tasks import TaskError
from pipelinerl.tasks.eval_sets import build_eval_sets

GYM = ["task.name=reasoning_gym", 'task.options={generator="chain_sum", params={min_terms=2, max_terms=2}}']


def test_each_set_is_the_task_with_its_own_options_and_the_task_s_own_set_comes_first():
    config = load_config(
        None,
        [
            *GYM,
            "eval.every=2",
            "task.eval_problems=6",
            "eval.sets={long={params={min_terms=5, max_terms=5}}}",
        ],
    )
    sets = build_eval_sets(config)
    assert list(sets) == ["heldout", "long"]
    assert [len(s.problems) for s in sets.values()] == [6, 6]
    assert all(p.data["entry"]["metadata"]["num_terms"] == 2 for p in sets["heldout"].problems)
    assert all(p.data["entry"]["metadata"]["num_terms"] == 5 for p in sets["long"].problems)
    assert set(sets["heldout"].by_id).isdisjoint(sets["long"].by_id)
    # Same config, same problems: the actor and the preprocessor build identical sets.
    again = build_eval_sets(config)
    assert [p.problem_id for p in again["long"].problems] == [p.problem_id for p in sets["long"].problems]


def test_a_set_whose_options_do_not_build_is_named():
    config = load_config(None, [*GYM, "eval.every=2", 'eval.sets={odd={generator="chain_summ"}}'])
    with pytest.raises(TaskError, match=r"eval set 'odd' \(eval.sets.odd\).*chain_sum"):
        build_eval_sets(config)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["eval.every=1", "eval.sets={heldout={}}"], "already eval.name"),
        (["eval.every=1", 'eval.sets={"no spaces"={}}'], "only letters"),
        (["eval.sets={extra={}}"], "set eval.every too"),
        (["eval.every=1", "eval.greedy=true"], "needs actor.engine='vllm'"),
        (["model.dtype=float16"], "model.dtype"),
    ],
)
def test_bad_eval_and_dtype_settings_are_refused_by_the_config(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)
