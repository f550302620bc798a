"""Held-out evaluation during the run, through the actor's own engine (``eval.every``). Pure logic.

Every ``eval.every`` policy versions, actor 0 submits each problem of every eval set (the task's
held-out split, named ``eval.name``, and any ``eval.sets``: ``tasks/eval_sets.py``) ``eval.samples``
(k) times to the engine that writes the training rollouts, at the actor's temperature or greedily
(``eval.greedy``), and sends the finished sequences downstream with ``split="eval"`` and the group
id ``eval/<set>/v<version>``,
where ``version`` is the policy the engine ran when the round was submitted. The preprocessor
scores them instead of training on them and, once the round is complete, appends one record to
``eval.jsonl``: pass@1 (mean correctness over all samples), pass@k (share of problems with a
correct sample), mean completion length, the label counts, and the share of sequences written by
more than one policy version (in pipeline mode weights change in flight during an eval round too;
in conventional mode a round's weights are frozen, so that share is 0).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.tasks.base import LABELS, Score

_GROUP = re.compile(r"^eval/(?P<set>[A-Za-z0-9_-]+)/v(?P<version>\d+)$")


def eval_group_id(set_name: str, version: int) -> str:
    return f"eval/{set_name}/v{version}"


def parse_eval_group_id(group_id: str) -> tuple[str, int] | None:
    """``(set, version)`` of an eval round's group id, or None for any other id."""
    match = _GROUP.match(group_id)
    return (match["set"], int(match["version"])) if match else None


@dataclass
class EvalSchedule:
    """When the actor evaluates: every ``every`` versions after ``start_version`` (0: never)."""

    every: int
    start_version: int

    def __post_init__(self) -> None:
        self.next_version = self.start_version + self.every

    def due(self, version: int) -> bool:
        """True once for each multiple of ``every`` the engine's ``version`` has reached."""
        if not self.every or version < self.next_version:
            return False
        while self.next_version <= version:
            self.next_version += self.every
        return True


@dataclass
class _Round:
    expected: int
    scores: list[tuple[str, Score, int, bool]] = field(default_factory=list)  # problem, score, length, mixed


@dataclass
class EvalCollector:
    """The preprocessor's side: scores eval sequences and closes each round into one record."""

    samples: int
    rounds: dict[str, _Round] = field(default_factory=dict)

    def add(
        self, group_id: str, group_size: int, problem_id: str, score: Score, length: int, mixed: bool
    ) -> dict[str, Any] | None:
        """Take one scored eval sequence; the round's record once its last sequence is in."""
        parsed = parse_eval_group_id(group_id)
        if parsed is None:
            raise ValueError(f"{group_id!r} is not an eval round's group id")
        entry = self.rounds.setdefault(group_id, _Round(expected=group_size))
        entry.scores.append((problem_id, score, length, mixed))
        if len(entry.scores) < entry.expected:
            return None
        del self.rounds[group_id]
        return round_record(*parsed, entry.scores, self.samples)


def pass_at_k(samples: int, correct: int, k: int) -> float:
    """The unbiased pass@k estimate for one problem with ``correct`` of ``samples`` right (Chen et al.
    2021): 1 - C(samples - correct, k) / C(samples, k)."""
    if k > samples:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {samples}")
    if samples - correct < k:
        return 1.0
    estimate = 1.0
    for drawn in range(samples - correct + 1, samples + 1):
        estimate *= 1.0 - k / drawn
    return 1.0 - estimate


def round_record(
    set_name: str, version: int, scores: list[tuple[str, Score, int, bool]], samples: int
) -> dict[str, Any]:
    """The eval record of one complete round (see the module docstring)."""
    by_problem: dict[str, list[Score]] = {}
    for problem_id, score, _, _ in scores:
        by_problem.setdefault(problem_id, []).append(score)
    correct = {pid: sum(s.label == "correct" for s in group) for pid, group in by_problem.items()}
    labels = Counter(score.label for _, score, _, _ in scores)
    pass_at_1 = sum(correct[pid] / len(group) for pid, group in by_problem.items()) / len(by_problem)
    record: dict[str, Any] = {
        registry.POLICY_VERSION: version,
        registry.EVAL_SET: set_name,
        registry.EVAL_PROBLEMS: len(by_problem),
        registry.EVAL_SAMPLES: samples,
        registry.name_of(registry.EVAL_PASS_AT, k=1): pass_at_1,
        registry.EVAL_MEAN_REWARD: sum(score.reward for _, score, _, _ in scores) / len(scores),
        registry.EVAL_MEAN_LENGTH: sum(length for _, _, length, _ in scores) / len(scores),
        registry.EVAL_MIXED_VERSION_FRACTION: sum(mixed for *_, mixed in scores) / len(scores),
        registry.EVAL_LABELS: {label: labels[label] for label in LABELS},
        registry.TIME: time.time(),
    }
    if samples > 1:
        record[registry.name_of(registry.EVAL_PASS_AT, k=samples)] = sum(
            pass_at_k(len(by_problem[pid]), correct[pid], samples) for pid in by_problem
        ) / len(by_problem)
    return record
