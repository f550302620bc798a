"""Task registry: the problem sources the platform can train on, by name or by import path.

Shipped tasks are imported only when asked for (``reasoning_gym`` and ``math_verify`` are not
loaded by a run of the arithmetic task). A user's own task is ``"package.module:Class"``: any
class with the ``Task`` contract (``tasks/base.py``, ``docs/tasks.md``), built with the run's
``task.options`` as keyword arguments.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pipelinerl.platform.config import ConfigError
from pipelinerl.tasks.base import LABELS, Label, Message, Problem, Score, Split, Task, safe_score

if TYPE_CHECKING:
    from pipelinerl.platform.config import TaskConfig

# name -> "module:Class", imported on first use
_SHIPPED: dict[str, str] = {
    "arithmetic": "pipelinerl.tasks.arithmetic:ArithmeticTask",
    "math": "pipelinerl.tasks.math:MathTask",
    "reasoning_gym": "pipelinerl.tasks.reasoning_gym_task:ReasoningGymTask",
}
TASK_NAMES: tuple[str, ...] = tuple(sorted(_SHIPPED))


class TaskError(ConfigError):
    """A task that cannot be built: unknown name, bad options, missing data; the message says which."""


def get_task(name: str, **options: Any) -> Task:
    """Build the task called ``name`` (shipped, or ``"package.module:Class"``) with ``options``."""
    target = _SHIPPED.get(name, name)
    module_name, _, class_name = target.partition(":")
    if not class_name:
        raise TaskError(
            f"unknown task {name!r}; valid tasks: {', '.join(TASK_NAMES)}, or 'package.module:Class'"
        )
    try:
        factory = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise TaskError(f"task {name!r}: cannot import {target!r} ({error})") from error
    try:
        task = factory(**options)
    except TypeError as error:  # an option the task does not take
        raise TaskError(f"task {name!r}: bad task.options {sorted(options)}: {error}") from error
    except ValueError as error:  # the task's own validation (missing file, wrong field, ...)
        raise TaskError(f"task {name!r}: {error}") from error
    missing = [
        attribute
        for attribute in ("name", "stop_strings", "problems", "score")
        if not hasattr(task, attribute)
    ]
    if missing:
        raise TaskError(
            f"task {name!r}: {target} lacks {', '.join(missing)} of the Task contract (docs/tasks.md)"
        )
    return task


def build_task(config: TaskConfig) -> Task:
    """The run's task: ``task.name`` built with ``task.options``."""
    return get_task(config.name, **config.options)


__all__ = [
    "LABELS",
    "TASK_NAMES",
    "Label",
    "Message",
    "Problem",
    "Score",
    "Split",
    "Task",
    "TaskError",
    "build_task",
    "get_task",
    "safe_score",
]
