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
