"""The task contract: where problems come from, how a prompt is put to the model, how a completion is scored.

A task is one class a user can write in one file (``docs/tasks.md``). Invariants every task keeps:

* ``problems(split, count, seed)`` is a pure function of its arguments (same call, same list), so
  the actor and the preprocessor, which build the list independently, agree on every problem id.
* The ``train`` and ``eval`` splits never share a problem, so held-out success measures
  generalisation, not memorisation.
* ``score`` never raises and never hangs: any string (empty, truncated, garbage) gets a ``Score``
  whose label says why (``no_answer``, ``unparsable``). The preprocessor still guards the call
  (``safe_score``): a scorer that raises anyway gives ``unparsable`` and a zero reward.
* A problem carries its prompt as plain text (``prompt``) and, when the task is a conversation, as
  chat ``messages``; the actor renders the messages with the tokenizer's chat template
  (``model.chat_template``) or falls back to the text.
* ``reference_completion`` (optional) is a worked solution for the supervised warm-start of the
  embedded model: plain text that ends right before the end-of-sequence token.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Split = Literal["train", "eval"]
SPLITS: tuple[Split, ...] = ("train", "eval")

Label = Literal["correct", "wrong", "no_answer", "unparsable"]
LABELS: tuple[Label, ...] = ("correct", "wrong", "no_answer", "unparsable")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Message:
    """One turn of a chat prompt."""

    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True)
class Problem:
    """One prompt with what its scorer needs to check an answer."""

    problem_id: str
    prompt: str  # the prompt as plain text (used when no chat template applies)
    answer: str  # the expected final answer, as text
    messages: tuple[Message, ...] = ()  # the prompt as a conversation, when the task gives one
    data: Mapping[str, Any] = field(default_factory=dict, compare=False)  # anything else the scorer needs


@dataclass(frozen=True)
class Score:
    """What a completion earned: the correctness reward and why."""

    reward: float
    label: Label

    def __post_init__(self) -> None:
        if self.label not in LABELS:
            raise ValueError(f"score label {self.label!r} is not one of {', '.join(LABELS)}")


@runtime_checkable
class Task(Protocol):
    """A source of checkable problems (see the module docstring for the invariants)."""

    name: str
    # Strings that end a completion (besides the tokenizer's end-of-sequence tokens); may be empty.
    stop_strings: tuple[str, ...]

    def problems(self, split: Split, count: int, seed: int) -> list[Problem]:
        """``count`` problems of ``split``, determined by ``seed`` (fewer only if the source has fewer)."""
        ...

    def score(self, problem: Problem, completion: str) -> Score:
        """The completion's reward and label; never raises."""
        ...


def safe_score(task: Task, problem: Problem, completion: str) -> Score:
    """``task.score``, with a scorer that raises turned into ``unparsable`` and a zero reward (logged)."""
    try:
        score = task.score(problem, completion)
    except Exception as error:  # a user's scorer must not take the preprocessor down
        logger.warning("task %s: scoring problem %s raised %r", task.name, problem.problem_id, error)
        return Score(0.0, "unparsable")
    if not isinstance(score, Score):
        logger.warning("task %s: score() returned %r, not a Score", task.name, score)
        return Score(0.0, "unparsable")
    return score


def reference_completion(task: Task, problem: Problem) -> str:
    """The task's worked solution for the warm-start; a clear error when the task has none."""
    method = getattr(task, "reference_completion", None)
    if method is None:
        raise ValueError(
            f"task {task.name!r} has no reference completions, so the embedded model cannot be "
            "warm-started on it: give a model directory (model.path)"
        )
    return str(method(problem))
