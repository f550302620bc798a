"""The actor's admission and drain decisions, pure: no sockets, threads, engines or clocks.

The actor's loops (``actor.py``) only call these and do what they say. The settings enter once, as
numbers (``continuous_admission``, ``conventional_round``): H (``actor.max_in_flight``), G
(``rl.group_size``), the round's groups, the drain lag; the state at each call does too: the
sequences in flight, the policy versions of the staged weights and of the engine, a stop asked for.

* ``pipeline``: keep H in flight, admitting whole groups of G as sequences finish; the weights thread
  loads every update as it arrives (``loads_on_receipt``).
* ``async``: the same, but an update stays staged until the engine is ``run.async_drain_lag``
  versions behind it; the actor then drains (admits nothing, no eval round) until nothing is in
  flight, loads the staged weights and admits again (``ContinuousAdmission``).
* ``conventional`` (with ``run.train_during_round`` true or false: the actor runs both alike; only
  the preprocessor holds a strict round back): rounds of G steps' batches generated with frozen
  weights, at most max(H, G) in flight so that a group larger than H still goes, alone; then the
  actor waits for the version G steps on (``ConventionalRound``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.config.base import Mode


def runs_rounds(mode: Mode) -> bool:
    """Whether the actor runs conventional rounds (else it keeps generating: pipeline, async)."""
    return mode == "conventional"


def loads_on_receipt(mode: Mode) -> bool:
    """Whether the weights thread loads an update as soon as it is received (pipeline: in flight;
    conventional: the actor is waiting for it) or stages it for the main thread's drain (async)."""
    return mode != "async"


def groups_that_fit(in_flight: int, capacity: int, group_size: int) -> int:
    """Whole groups of ``group_size`` that fit beside ``in_flight`` sequences under ``capacity``
    (0 when ``in_flight`` already exceeds it, as it may after an eval round)."""
    return max(0, (capacity - in_flight) // group_size)


def round_groups(steps_per_round: int, batch_size: int, group_size: int) -> int:
    """Groups in one conventional round: ``steps_per_round`` batches of ``batch_size`` samples, G a group
    (the config makes the batch a multiple of G)."""
    return steps_per_round * batch_size // group_size


def wait_over(engine_version: int, wanted_version: int, stop_requested: bool) -> bool:
    """Whether the actor waiting for ``wanted_version`` (the next round's weights) may go on."""
    return stop_requested or engine_version >= wanted_version


@dataclass
class ContinuousAdmission:
    """Pipeline and async modes: H in flight, admitted a group at a time; async drains to update.

    Each turn of the loop asks ``load_now`` first, then ``eval_may_start``, then ``groups_to_admit``.
    """

    max_in_flight: int  # H
    group_size: int  # G
    drain_lag: int | None = None  # async: run.async_drain_lag; None: the weights thread loads updates
    draining: bool = False

    def load_now(self, staged_version: int, engine_version: int, in_flight: int) -> bool:
        """Whether to load the staged weights now (async only). A drain starts once the staged weights
        are ``drain_lag`` or more versions ahead of the engine's (never while they are behind it: the
        first staged version is -1); it is over when nothing is in flight, and then they load."""
        if self.drain_lag is None:
            return False
        if staged_version - engine_version >= self.drain_lag:
            self.draining = True
        if self.draining and in_flight == 0:
            self.draining = False
            return True
        return False

    def eval_may_start(self) -> bool:
        """An eval round due now waits while the actor drains (it would hold the drain up)."""
        return not self.draining

    def groups_to_admit(self, in_flight: int) -> int:
        """Groups to submit now: none while draining, else as many whole groups as fit under H (with
        G > H, none ever does: unlike a conventional round, these modes do not let one group exceed H)."""
        if self.draining:
            return 0
        return groups_that_fit(in_flight, self.max_in_flight, self.group_size)


@dataclass
class ConventionalRound:
    """One conventional round: ``groups_left`` groups generated with the weights of ``start_version``,
    then a wait for ``next_version``, the weights after the trainer's ``steps`` steps on them."""

    start_version: int
    steps: int  # run.steps_per_round, G
    groups_left: int
    max_in_flight: int  # H
    group_size: int  # G

    @property
    def next_version(self) -> int:
        return self.start_version + self.steps

    def groups_to_admit(self, in_flight: int) -> int:
        """Groups to submit now; the caller submits exactly these (they leave ``groups_left``). At most
        max(H, G) in flight: a group larger than H goes alone rather than never."""
        capacity = max(self.max_in_flight, self.group_size)
        admit = min(self.groups_left, groups_that_fit(in_flight, capacity, self.group_size))
        self.groups_left -= admit
        return admit

    def over(self, in_flight: int) -> bool:
        """Every group of the round submitted and every sequence (eval ones too) finished."""
        return self.groups_left == 0 and in_flight == 0

    def generating(self, in_flight: int, stop_requested: bool) -> bool:
        """Whether the round's loop goes on: the round is not over and no stop was asked for."""
        return not stop_requested and not self.over(in_flight)


def continuous_admission(config: PipelineConfig) -> ContinuousAdmission:
    """A pipeline or async run's admission: H, G and, in async mode, ``run.async_drain_lag``."""
    run = config.run
    return ContinuousAdmission(
        max_in_flight=config.actor.max_in_flight,
        group_size=config.rl.group_size,
        drain_lag=None if loads_on_receipt(run.mode) else run.async_drain_lag,
    )


def conventional_round(config: PipelineConfig, start_version: int) -> ConventionalRound:
    """The conventional round that starts with the engine at ``start_version``: the batches of the steps
    up to the next version the trainer publishes (a multiple of G, ``trainer.publishes_after``): G of
    them, fewer for a run resumed from a checkpoint inside a round (which otherwise waited for a version
    never published)."""
    run, rl = config.run, config.rl
    steps = run.steps_per_round - start_version % run.steps_per_round
    return ConventionalRound(
        start_version=start_version,
        steps=steps,
        groups_left=round_groups(steps, rl.batch_size, rl.group_size),
        max_in_flight=config.actor.max_in_flight,
        group_size=rl.group_size,
    )
