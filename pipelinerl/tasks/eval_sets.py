"""The run's named eval sets: the task's own held-out split (``eval.name``) and any ``eval.sets``.

An extra set is the same task built with its own options in place of ``task.options`` (another dataset
file, other generator parameters), of which the held-out split is evaluated: ``eval.sets =
{math500 = {dataset = "/data/math500.jsonl", eval_fraction = 0.99}}``. The actor that writes the
eval rounds and the preprocessor that scores them build the same sets from the same config, so a
problem id means the same problem on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipelinerl.tasks import Problem, Task, TaskError, build_task, get_task

if TYPE_CHECKING:
    from pipelinerl.platform.config import PipelineConfig


@dataclass(frozen=True)
class EvalSet:
    name: str
    task: Task
    problems: list[Problem]
    by_id: dict[str, Problem] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_id", {problem.problem_id: problem for problem in self.problems})


def build_eval_sets(config: PipelineConfig, task: Task | None = None) -> dict[str, EvalSet]:
    """Every eval set by name, the task's own first; ``task``: the run's task if already built.

    Raises ``TaskError`` naming the set whose options do not build or whose held-out split is empty.
    """
    count, seed = config.task.eval_problems, config.run.seed
    own = task if task is not None else build_task(config.task)
    sets = {config.eval.name: EvalSet(config.eval.name, own, own.problems("eval", count, seed))}
    for name, options in config.eval.sets.items():
        try:
            set_task = get_task(config.task.name, **{**config.task.options, **options})
        except TaskError as error:
            raise TaskError(f"eval set {name!r} (eval.sets.{name}): {error}") from None
        problems = set_task.problems("eval", count, seed)
        if not problems:
            raise TaskError(f"eval set {name!r} has no held-out problems (eval.sets.{name}={options})")
        sets[name] = EvalSet(name, set_task, problems)
    return sets
