"""The task registry and contract: shipped names, a user's task by import path, clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipelinerl.platform.config import ConfigError, load_config
from pipelinerl.tasks import TASK_NAMES, TaskError, build_task, get_task
from pipelinerl.tasks.base import Problem, Score, reference_completion, safe_score


class EchoTask:
    """A task written in one file: the answer is the prompt reversed."""

    name = "echo"
    stop_strings = ("\n",)

    def __init__(self, words: int = 2) -> None:
        if words < 1:
            raise ValueError(f"words must be >= 1, got {words}")
        self.words = words

    def problems(self, split, count, seed):
        offset = 0 if split == "train" else 10_000
        return [Problem(f"echo-{offset + i}", f"w{offset + i}", f"{offset + i}w") for i in range(count)]

    def score(self, problem, completion):
        if not completion.strip():
            return Score(0.0, "no_answer")
        return Score(1.0, "correct") if completion.strip() == problem.answer else Score(0.0, "wrong")


def test_shipped_tasks_are_named() -> None:
    assert set(TASK_NAMES) == {"arithmetic", "math", "reasoning_gym"}
    assert get_task("arithmetic").name == "arithmetic"


def test_a_users_task_by_import_path_with_options() -> None:
    config = load_config(None, [f"task.name={__name__}:EchoTask", "task.options.words=3"])
    task = build_task(config.task)
    assert isinstance(task, EchoTask) and task.words == 3
    problem = task.problems("train", 1, 0)[0]
    assert safe_score(task, problem, "0w").label == "correct"


def test_bad_names_and_options_say_what_is_wrong() -> None:
    with pytest.raises(ConfigError, match="unknown task 'aritmetic'"):
        load_config(None, ["task.name=aritmetic"])
    with pytest.raises(TaskError, match="cannot import 'no_such_module:Task'"):
        get_task("no_such_module:Task")
    with pytest.raises(TaskError, match=r"bad task.options \['colour'\]"):
        get_task(f"{__name__}:EchoTask", colour="red")
    with pytest.raises(TaskError, match="words must be >= 1, got 0"):
        get_task(f"{__name__}:EchoTask", words=0)
    with pytest.raises(TaskError, match="lacks .*score"):
        get_task("builtins:object")


def test_scores_are_checked_and_a_broken_scorer_is_contained() -> None:
    with pytest.raises(ValueError, match="not one of correct"):
        Score(1.0, "right")  # type: ignore[arg-type]

    class Broken(EchoTask):
        def score(self, problem, completion):
            return 1.0  # not a Score

    problem = EchoTask().problems("train", 1, 0)[0]
    assert safe_score(Broken(), problem, "x") == Score(0.0, "unparsable")


def test_a_task_without_reference_completions_cannot_warm_start() -> None:
    with pytest.raises(ValueError, match="no reference completions"):
        reference_completion(EchoTask(), EchoTask().problems("train", 1, 0)[0])


def test_the_task_written_in_docs_works(tmp_path, monkeypatch) -> None:
    """docs/tasks.md's example, as a user would save it: importable, deterministic, disjoint, scored."""
    docs = (Path(__file__).resolve().parents[3] / "docs" / "tasks.md").read_text()
    (source,) = [
        block for block in re.findall(r"```python\n(.*?)```", docs, re.S) if "class VowelTask" in block
    ]
    (tmp_path / "docs_vowels.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    task = get_task("docs_vowels:VowelTask", min_length=4)
    train, held_out = task.problems("train", 50, 0), task.problems("eval", 50, 0)
    assert train == task.problems("train", 50, 0)
    assert {p.prompt for p in train}.isdisjoint({p.prompt for p in held_out})
    problem = train[0]
    assert safe_score(task, problem, f"so <answer>{problem.answer}</answer>").label == "correct"
    assert safe_score(task, problem, "<answer>x</answer>").label == "unparsable"
    assert safe_score(task, problem, "no idea").label == "no_answer"
