"""The order in which an actor takes its train prompts: seeded epochs, one share per actor, resumable.

Its own module so that the engine benchmark (``bench/engine_workload.py``) draws the actor's prompt
order without importing the actor. Pure (numpy only, no torch) but for ``actor_prompts``, which reads
the checkpoint a run resumes from.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from pathlib import Path

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


def stream_after_rebase(
    config: PipelineConfig,
    problems: list[Problem],
    actor_id: int,
    checkpoint: Path | None,
    kept: set[int],
    furthest: int,
) -> tuple[Iterator[tuple[int, Problem]], int]:
    """An actor that outlives a restart of the trainer role from ``checkpoint`` (None: from the start)
    goes on with that checkpoint's stream (``actor_prompts``), leaving out the positions of the groups
    it ``kept`` in its engine. Also returns how many of the positions it handed out (up to ``furthest``)
    it will hand out again: ``restart/regenerated``."""
    resumed = config.model_copy(update={"run": config.run.model_copy(update={"resume_from": checkpoint})})
    stream = (
        (position, problem)
        for position, problem in actor_prompts(resumed, problems, actor_id)
        if position not in kept
    )
    trained = read_trained(checkpoint) if checkpoint is not None else TrainedSoFar()
    again = set(trained.untrained_before(actor_id))
    again.update(range(trained.prompt_positions.get(actor_id, 0), furthest + 1))
    return stream, len(again - kept)
