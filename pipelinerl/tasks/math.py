"""The math task: problems with a final answer, checked by math-verify, so that equivalent forms
count (``0.5`` = ``1/2`` = ``\\frac{1}{2}``).

Problems come from the shipped set (400 problems the project generated, ``math_data.py``) or from
a local dataset: JSONL, Parquet, a directory with train and test files, or a saved Hugging Face
dataset (``math_sources.py`` has the layouts, the splits and the reference-answer formats).

A problem's prompt is the question, a blank line and ``instruction``; as chat messages, the same
text as the user turn after an optional system turn. Its id is ``math-<hash of the question>``,
the same in every process and run. ``problems(split, count, seed)`` is a seeded shuffle of the
split (a longer request extends a shorter one with the same seed); a split with fewer problems
than asked gives them all.

Scoring (``math_grading.py``): the final answer is the last ``\\boxed{...}`` of the completion
(or the group of ``answer_pattern``'s last match); none is ``no_answer``, one math-verify cannot
parse is ``unparsable``, then ``correct`` (reward 1) or ``wrong``. A check that takes longer than
``score_timeout_s`` is ``unparsable``: it runs in a reused worker process, which is killed, so the
bound holds whichever thread calls ``score``.
"""

from __future__ import annotations

import importlib.util
import random
import re
from typing import Any

from pipelinerl.tasks.base import Message, Problem, Score, Split
from pipelinerl.tasks.math_grading import extract_answer, grade_with_timeout
from pipelinerl.tasks.math_sources import (
    ANSWER_FORMATS,
    AnswerFormat,
    FieldMap,
    MathRecord,
    load_splits,
    question_hash,
)

DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
# GSM8K's solutions carry calculator annotations (``<<48/2=24>>``) that no model should learn to write.
_CALCULATOR_ANNOTATION = re.compile(r"<<[^<>]*>>")


class MathTask:
    """Problems with a reference answer, from the shipped set or a local dataset (module docstring)."""

    name = "math"
    stop_strings: tuple[str, ...] = ()  # the model's end-of-sequence token ends a completion

    def __init__(
        self,
        *,
        dataset: str = "shipped",
        question_field: str = "problem",
        answer_field: str = "answer",
        solution_field: str | None = "solution",
        answer_format: AnswerFormat = "plain",
        split_field: str | None = None,
        answer_pattern: str | None = None,
        instruction: str = DEFAULT_INSTRUCTION,
        system_prompt: str | None = None,
        score_timeout_s: float = 2.0,
        eval_fraction: float = 0.1,
        dataset_revision: str | None = None,
        dataset_subset: str | None = None,
    ) -> None:
        if not isinstance(dataset, str) or not dataset.strip():
            raise ValueError(
                f"dataset must be 'shipped' or the path of a .jsonl or .parquet file or a dataset directory, "
                f"got {dataset!r}"
            )
        _check_field_name("question_field", question_field, optional=False)
        _check_field_name("answer_field", answer_field, optional=False)
        _check_field_name("solution_field", solution_field, optional=True)
        _check_field_name("split_field", split_field, optional=True)
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(
                f"answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}"
            )
        _check_answer_pattern(answer_pattern)
        if not isinstance(instruction, str):
            raise ValueError(f"instruction must be text (may be empty), got {instruction!r}")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"system_prompt must be text or None, got {system_prompt!r}")
        if not _is_number(score_timeout_s) or not 0 < score_timeout_s < float("inf"):
            raise ValueError(f"score_timeout_s must be a number of seconds > 0, got {score_timeout_s!r}")
        if not _is_number(eval_fraction) or not 0 < eval_fraction < 1:
            raise ValueError(
                f"eval_fraction must be a number strictly between 0 and 1, got {eval_fraction!r}"
            )
        _require_math_verify()

        self.dataset = dataset
        self.answer_format = answer_format
        self.solution_field = solution_field
        self.answer_pattern = answer_pattern
        self.instruction = instruction
        self.system_prompt = system_prompt or None
        self.score_timeout_s = float(score_timeout_s)
        fields = FieldMap(question_field, answer_field, solution_field, self.answer_format, split_field)
        for option, value in (("dataset_revision", dataset_revision), ("dataset_subset", dataset_subset)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{option} must be text or None, got {value!r}")
        splits = load_splits(dataset, fields, float(eval_fraction), dataset_revision, dataset_subset)
        self._records: dict[str, MathRecord] = {}
        self._pools: dict[Split, list[Problem]] = {}
        for split, records in splits.items():
            self._pools[split] = [self._problem(record) for record in records]
            self._records.update(
                (problem.problem_id, record)
                for problem, record in zip(self._pools[split], records, strict=True)
            )

    def _problem(self, record: MathRecord) -> Problem:
        text = f"{record.question}\n\n{self.instruction}" if self.instruction else record.question
        system = (Message("system", self.system_prompt),) if self.system_prompt else ()
        return Problem(
            problem_id=f"{self.name}-{question_hash(record.question)}",
            prompt=text,
            answer=record.answer,
            messages=(*system, Message("user", text)),
        )

    def problems(self, split: Split, count: int, seed: int) -> list[Problem]:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        order = list(self._pools[split])
        random.Random(f"{self.name}/{split}/{seed}").shuffle(order)
        return order[:count]

    def score(self, problem: Problem, completion: str) -> Score:
        """Reward 1 for an answer math-verify finds equivalent to the reference (module docstring)."""
        label = grade_with_timeout(completion, problem.answer, self.answer_pattern, self.score_timeout_s)
        return Score(1.0 if label == "correct" else 0.0, label)

    def reference_completion(self, problem: Problem) -> str:
        """The dataset's worked solution, ending with the answer where the scorer looks for it."""
        record = self._records.get(problem.problem_id)
        if record is None:
            raise ValueError(f"problem {problem.problem_id!r} is not in the math dataset {self.dataset!r}")
        if record.solution is None:
            raise ValueError(
                f"the math dataset {self.dataset!r} has no worked solutions "
                f"(solution_field={self.solution_field!r}), so it has no reference completions; "
                "name the field that holds them with solution_field"
            )
        text = record.solution.strip()
        if self.answer_format == "gsm8k":  # GSM8K's solution is its answer field: steps, then '#### 72'
            text = _CALCULATOR_ANNOTATION.sub("", text)
            if "####" in text:
                text = text[: text.rfind("####")].rstrip()
        if self.answer_pattern is None and extract_answer(text) is None:
            text = f"{text}\nThe answer is \\boxed{{{record.answer}}}"
        return text


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_field_name(option: str, value: Any, optional: bool) -> None:
    if optional and value is None:
        return
    if not isinstance(value, str) or not value:
        valid = "a field name, or None" if optional else "a field name"
        raise ValueError(f"{option} must be {valid}, got {value!r}")


def _check_answer_pattern(pattern: Any) -> None:
    if pattern is None:
        return
    if not isinstance(pattern, str):
        raise ValueError(
            f"answer_pattern must be None (the last \\boxed{{}}) or a regex with one group, got {pattern!r}"
        )
    try:
        groups = re.compile(pattern).groups
    except re.error as error:
        raise ValueError(f"answer_pattern {pattern!r} is not a valid regex ({error})") from error
    if groups != 1:
        raise ValueError(f"answer_pattern {pattern!r} has {groups} groups; it needs exactly one, the answer")


def _require_math_verify() -> None:
    for module in ("math_verify", "antlr4"):
        if importlib.util.find_spec(module) is None:
            raise ValueError(
                f"the math task scores with math-verify, but {module} is not installed: "
                "pip install 'math-verify[antlr4_13_2]'"
            )
