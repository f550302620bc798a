"""Task registry: the problem sources the platform can train on, by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipelinerl.tasks.arithmetic import ArithmeticTask
from pipelinerl.tasks.base import Problem, Split, Task

_FACTORIES: dict[str, Callable[..., Task]] = {
    ArithmeticTask.name: ArithmeticTask,
}
TASK_NAMES: tuple[str, ...] = tuple(sorted(_FACTORIES))


def get_task(name: str, **options: Any) -> Task:
    """Build the task called ``name``; ``options`` go to its constructor."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASK_NAMES)}")
    return factory(**options)


__all__ = ["TASK_NAMES", "Problem", "Split", "Task", "get_task"]
