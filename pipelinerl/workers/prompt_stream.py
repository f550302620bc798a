"""The order in which an actor takes its train prompts: seeded epochs, one share per actor, resumable.

Its own module so that the engine benchmark (``bench/engine_workload.py``) draws the actor's prompt
order without importing the actor. Pure: numpy only, no torch.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from pipelinerl.tasks.base import Problem


def prompt_stream(
    problems: list[Problem], seed: int, actor_id: int, num_actors: int, start: int = 0
) -> Iterator[Problem]:
    """Train problems in a seeded order, epoch after epoch; actor k takes every num_actors-th, from
    its ``start``-th on (a resumed run goes on where its checkpoint's policy left the stream)."""

    def every_epoch() -> Iterator[Problem]:
        for epoch in itertools.count():
            order = np.random.default_rng([seed, epoch]).permutation(len(problems))
            for index in order[actor_id::num_actors]:
                yield problems[int(index)]

    return itertools.islice(every_epoch(), start, None)


def problem_at(problems: list[Problem], seed: int, actor_id: int, num_actors: int, position: int) -> Problem:
    """The problem at ``position`` of actor ``actor_id``'s stream (``prompt_stream``'s order)."""
    per_epoch = len(range(actor_id, len(problems), num_actors))
    epoch, offset = divmod(position, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(len(problems))
    return problems[int(order[actor_id::num_actors][offset])]


def resumed_stream(
    problems: list[Problem], seed: int, actor_id: int, num_actors: int, start: int, again: list[int]
) -> Iterator[tuple[int, Problem]]:
    """(position, problem) of a resumed actor's stream: first the positions in ``again`` (handed out
    before the checkpoint, never trained into its policy), then the stream from ``start`` on."""
    for position in again:
        yield position, problem_at(problems, seed, actor_id, num_actors, position)
    yield from enumerate(prompt_stream(problems, seed, actor_id, num_actors, start=start), start=start)
