"""The task interface: where prompts come from and how completions are scored.

A task is a deterministic problem generator plus a verifier. Invariants every task keeps:

* ``problems(split, count, seed)`` is a pure function of its arguments (same call, same list).
* The ``train`` and ``eval`` splits never share a problem, whatever the counts and seeds, so
  held-out success measures generalisation, not memorisation.
* ``verify`` never raises: any string (empty, truncated, garbage) scores 0.0 unless its final
  answer is correct.
* ``reference_completion`` is the worked solution used for the supervised warm-start; it is
  plain text that ends right before the end-of-sequence token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

Split = Literal["train", "eval"]
SPLITS: tuple[Split, ...] = ("train", "eval")


@dataclass(frozen=True)
class Problem:
    """One prompt with its expected final answer."""

    problem_id: str
    prompt: str
    answer: str


class Task(Protocol):
    """A source of checkable problems (see the module docstring for the invariants)."""

    name: str

    def problems(self, split: Split, count: int, seed: int) -> list[Problem]:
        """``count`` problems of ``split``, determined by ``seed``."""
        ...

    def verify(self, problem: Problem, completion: str) -> float:
        """1.0 if the completion's final answer is correct, else 0.0."""
        ...

    def reference_completion(self, problem: Problem) -> str:
        """The worked solution for supervised warm-start (without the end-of-sequence token)."""
        ...
