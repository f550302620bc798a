"""Multi-digit addition worked column by column: the platform's default task.

Prompt and completion (``4821+397``)::

    prompt:      "4821+397\n"
    completion:  "1+7+0=08\n2+9+0=11\n8+3+1=12\n4+0+1=05\nA:5218"

One fixed-width line per column, right to left: the two digits (0 where an operand has run
out), the carry in, and the two-digit column sum whose first digit is the next carry. The last
line is the answer. Completions grow with the number of digits (13 characters for one digit,
64 for six), so sequence lengths vary as in long-form reasoning, which is where pipelined RL
pays off.

Splits: a problem belongs to ``eval`` iff a stable hash of ``"a+b"`` falls in the eval bucket,
so train and eval are disjoint for every seed and count. Each split draws from its own random
stream (seeded by task, split and seed) and rejects problems of the other split.

Difficulty: the longer operand has ``d`` digits with probability ``digit_weights[d - 1]``; the
other has 1 to ``d`` digits. With the uniform default, a warm-started tiny model solves the
short sums and part of the three- and four-digit ones, and RL has headroom on the long ones.
The hard part for a small causal model is finding the k-th digit from the right of the first
operand (its offset depends on the second operand's length); column sums and carries come early.
"""

from __future__ import annotations

import hashlib
import random
import re

from pipelinerl.tasks.base import Problem, Score, Split

# One problem in eight (by hash) is held out: enough distinct 1-digit pairs land in eval (about
# 12 of 100) while train keeps the rest.
EVAL_BUCKETS = 8
# Weights for 1..6 digits in the longer operand (see the module docstring).
DEFAULT_DIGIT_WEIGHTS: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0)

_ANSWER = re.compile(r"A:(\d+)\s*$")


def _is_eval(key: str) -> bool:
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % EVAL_BUCKETS == 0


def _random_number(rng: random.Random, digits: int) -> int:
    if digits == 1:
        return rng.randint(0, 9)
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def column_steps(a: int, b: int) -> list[str]:
    """The worked lines for ``a + b``, least significant column first."""
    digits_a, digits_b = str(a)[::-1], str(b)[::-1]
    carry = 0
    lines = []
    for column in range(max(len(digits_a), len(digits_b))):
        x = int(digits_a[column]) if column < len(digits_a) else 0
        y = int(digits_b[column]) if column < len(digits_b) else 0
        total = x + y + carry
        lines.append(f"{x}+{y}+{carry}={total:02d}")
        carry = total // 10
    return lines


class ArithmeticTask:
    """Addition of two non-negative integers of 1 to ``len(digit_weights)`` digits."""

    name = "arithmetic"
    stop_strings: tuple[str, ...] = ()  # the tokenizer's end-of-sequence token ends a completion

    def __init__(self, digit_weights: tuple[float, ...] = DEFAULT_DIGIT_WEIGHTS) -> None:
        if not digit_weights or any(weight < 0 for weight in digit_weights) or sum(digit_weights) <= 0:
            raise ValueError(f"digit_weights must be non-negative with a positive sum, got {digit_weights!r}")
        self.digit_weights = tuple(float(weight) for weight in digit_weights)

    def problems(self, split: Split, count: int, seed: int) -> list[Problem]:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        rng = random.Random(f"{self.name}/{split}/{seed}")
        sizes = range(1, len(self.digit_weights) + 1)
        problems: list[Problem] = []
        for index in range(count):
            a, b = self._operands(rng, rng.choices(sizes, weights=self.digit_weights)[0], split)
            problems.append(
                Problem(
                    problem_id=f"{self.name}-{split}-{seed}-{index}",
                    prompt=f"{a}+{b}\n",
                    answer=str(a + b),
                )
            )
        return problems

    @staticmethod
    def _operands(rng: random.Random, longer: int, split: Split) -> tuple[int, int]:
        # Rejection sampling within the chosen size keeps the digit mix identical in both splits.
        while True:
            a = _random_number(rng, longer)
            b = _random_number(rng, rng.randint(1, longer))
            if rng.random() < 0.5:
                a, b = b, a
            if _is_eval(f"{a}+{b}") == (split == "eval"):
                return a, b

    def score(self, problem: Problem, completion: str) -> Score:
        """``correct`` when the completion ends with ``A:<the sum>``; ``no_answer`` without that line."""
        match = _ANSWER.search(completion)
        if match is None:
            return Score(0.0, "no_answer")
        return Score(1.0, "correct") if match.group(1) == problem.answer else Score(0.0, "wrong")

    def reference_completion(self, problem: Problem) -> str:
        a, b = (int(operand) for operand in problem.prompt.strip().split("+"))
        return "\n".join([*column_steps(a, b), f"A:{a + b}"])
