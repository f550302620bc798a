"""The order in which an actor takes its train prompts: seeded epochs, one share per actor, resumable.

Its own module so that the engine benchmark (``bench/engine_workload.py``) draws the actor's prompt
order without importing the actor. Pure (numpy only, no torch) but for ``actor_prompts``, which reads
the checkpoint a run resumes from.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

import numpy as np

from pipelinerl.platform.checkpoint import TrainedSoFar, read_trained
from pipelinerl.platform.config import PipelineConfig
from pipelinerl.tasks.base import Problem

logger = logging.getLogger("pipelinerl.actor")


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


def actor_prompts(
    config: PipelineConfig, problems: list[Problem], actor_id: int
) -> Iterator[tuple[int, Problem]]:
    """Actor ``actor_id``'s (position, problem) stream. A resumed run's: first the prompts it handed out
    before the checkpoint and the checkpoint's policy was not trained on (in flight, queued, dropped),
    then the stream after the last one it trained on."""
    resume_from = config.run.resume_from
    trained = TrainedSoFar() if resume_from is None else read_trained(resume_from)
    start, again = trained.prompt_positions.get(actor_id, 0), trained.untrained_before(actor_id)
    if start:
        logger.info(
            "actor %d: prompt stream resumes at position %d, after %d earlier prompts its policy was not "
            "trained on, handed out again first",
            actor_id,
            start,
            len(again),
        )
    return resumed_stream(problems, config.run.seed, actor_id, config.actor.num_actors, start, again)
