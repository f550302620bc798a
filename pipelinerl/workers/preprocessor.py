"""The preprocessor stage: rewards, leave-one-out advantages, and train batches of B sequences.

Rollouts arrive from the actors one finished sequence at a time. A group (the G samples of one
prompt) is scored by the task once it is complete (a scorer that raises gives ``unparsable`` and
a zero reward; every label is counted, ``scores/<label>``); its advantages are leave-one-out
(paper §2: A_i = R_i − mean_{j≠i} R_j). Complete groups fill a batch of ``rl.batch_size``
sequences, packed into micro-batches by padded-token budget, which goes to the trainer. Nothing is
dropped silently: a duplicate rollout id or a rollout of an unknown problem is counted and logged.

A batch goes to the trainer only when the trainer is at most ``transport.batches_ahead`` steps
behind it (its weight notices say how far it is, ``TrainerProgress``); until then the preprocessor
stops reading rollouts, so the actors feel the backpressure and stop generating instead of piling
up stale data. Together with bounded socket queues (high-water marks and ``socket_buffer_kib``)
this is what keeps the lag of trained tokens bounded when the actors outrun the trainer.

In conventional mode with ``run.train_during_round = false`` the batches of a round are also held
until the whole round is generated (``RoundBarrier``), so the trainer starts only then, as in the
paper's baseline; by default the trainer takes each step as soon as its batch is full.

Every batch sent appends a record to ``preprocessor.jsonl`` in the run directory: the step it feeds,
the trainer's version then, the rollouts waiting here (incomplete groups and scored sequences not
yet batched), rejected and malformed counts. When it stops, ``preprocessor.final.json`` holds the
same counts then, with what came after the last batch.

Run: ``python -m pipelinerl.workers.preprocessor --run-dir runs/<id>`` (the launcher does).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import zmq

from pipelinerl.platform.checkpoint import starting_version
from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.curve_keys import CurveKeys
from pipelinerl.platform.jsonl import JsonlWriter
from pipelinerl.platform.numbering import actor_sender
from pipelinerl.platform.prompt_records import dropped_prompts_path
from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.transport import Receiver, Sender, run_keys
from pipelinerl.platform.wire import (
    Rollout,
    Shutdown,
    TrainBatch,
    TrainSequence,
    WeightUpdate,
    impossible_values,
)
from pipelinerl.rl.advantages import leave_one_out_advantages
from pipelinerl.rl.overlong import overlong_penalty
from pipelinerl.rl.packing import pack_micro_batches
from pipelinerl.tasks import build_task
from pipelinerl.tasks.base import LABELS, Problem, Score, Task, safe_score
from pipelinerl.tasks.eval_sets import EvalSet, build_eval_sets
from pipelinerl.workers.evaluation import EvalCollector, parse_eval_group_id

logger = logging.getLogger("pipelinerl.preprocessor")


@dataclass(frozen=True)
class RewardPolicy:
    """A completion's reward from its score, and what a truncated one trains on (``rl.truncated``).

    * reward = the task's correctness reward, plus ``format_reward`` when the completion gave an
      answer the checker could read (label ``correct`` or ``wrong``);
    * a completion cut at ``actor.max_new_tokens`` (not finished) under ``truncated``:
      ``"train"``: trained like any other; ``"mask"``: keeps its reward in its group's baseline but
      gets advantage 0, so it adds nothing to the loss or its gradient; ``"penalise"``: its reward
      is ``-truncated_penalty`` whatever its answer;
    * with ``overlong_buffer`` (``rl.overlong``): DAPO's soft overlong punishment,
      ``overlong_penalty(length, max_length, overlong_buffer)`` in [-1, 0], is added to the reward of
      every completion, before advantages are computed (0 up to ``max_length - overlong_buffer``
      tokens, then down linearly to -1 at ``max_length``).
    """

    truncated: Literal["train", "mask", "penalise"] = "train"
    truncated_penalty: float = 1.0
    format_reward: float = 0.0
    overlong_buffer: int | None = None  # rl.overlong.buffer when rl.overlong.enabled, else None: off
    max_length: int = 0  # actor.max_new_tokens: the overlong penalty reaches -1 there

    def reward(self, score: Score, finished: bool, length: int = 0) -> float:
        """The reward of a completion of ``length`` tokens (the length counts only for the overlong
        penalty)."""
        if not finished and self.truncated == "penalise":
            return -self.truncated_penalty
        reward = score.reward + (self.format_reward if score.label in ("correct", "wrong") else 0.0)
        if self.overlong_buffer is not None:
            reward += overlong_penalty(length, self.max_length, self.overlong_buffer)
        return reward

    def advantage(self, advantage: float, finished: bool) -> float:
        return 0.0 if not finished and self.truncated == "mask" else advantage


@dataclass
class BatchBuilder:
    """Pure logic: groups in, batches out."""

    task: Task
    problems: dict[str, Problem]
    batch_size: int
    micro_batch_tokens: int
    normalize_advantages: bool
    groups: dict[str, list[Rollout]] = field(default_factory=lambda: defaultdict(list))
    ready: list[TrainSequence] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    rewards: RewardPolicy = field(default_factory=lambda: RewardPolicy())
    drop_zero_variance_groups: bool = False
    max_lag: int | None = None  # a sequence with a token older than this at train time is dropped
    start_version: int = 0  # the version the first batch is trained at
    ranks: int = 1  # trainer ranks: batch i feeds optimizer step i // ranks
    run_id: str | None = None  # rollouts of another run are rejected (None: not checked)
    group_size: int | None = None  # train groups of another size are rejected (None: not checked)
    max_incomplete_groups: int | None = None  # past it, the oldest incomplete group is dropped
    max_completion_tokens: int | None = None  # actor.max_new_tokens: no actor writes a longer completion
    batches_made: int = 0
    rejected: int = 0  # rollouts refused at the boundary: impossible values, duplicates, unknown problems
    evicted: OrderedDict[str, None] = field(default_factory=OrderedDict)  # recently dropped incomplete groups
    labels: Counter[str] = field(default_factory=Counter)  # scored rollouts by label, since the start
    dropped: Counter[str] = field(default_factory=Counter)  # samples dropped: "zero_variance", "stale"
    drops: list[dict[str, Any]] = field(default_factory=list)  # each drop's group and reason, not yet written

    def _drop(self, group_id: str, reason: str, rollouts: int) -> None:
        """Count the drop, and keep it for the prompt records (which prompt lost what, and why)."""
        self.dropped[reason] += rollouts
        step = self.start_version + self.batches_made // self.ranks
        self.drops.append({"group_id": group_id, "reason": reason, "rollouts": rollouts, registry.STEP: step})

    def reject(self, rollout: Rollout, reason: str) -> None:
        """Count and log a rollout refused at the stage boundary."""
        self.rejected += 1
        logger.warning("rollout %r rejected (%d so far): %s", rollout.rollout_id[:64], self.rejected, reason)

    def check(self, rollout: Rollout, newest_version: int | None = None) -> str | None:
        """Why ``rollout`` (of either split) cannot be used, or None: another run's, impossible values
        (``wire.impossible_values``; tokens newer than ``newest_version``, the trainer's latest)."""
        if self.run_id is not None and rollout.run_id != self.run_id:
            return f"run id {rollout.run_id[:64]!r} is not this run's"
        return impossible_values(
            rollout, newest_version=newest_version, max_completion_tokens=self.max_completion_tokens
        )

    def add(self, rollout: Rollout, newest_version: int | None = None) -> list[TrainBatch]:
        """Take one rollout; return the batches that became complete (usually none or one).

        A rollout that cannot be used is rejected (counted, logged), never kept."""
        if (reason := self.check(rollout, newest_version) or self._group_problem(rollout)) is not None:
            self.reject(rollout, reason)
            return []
        self.seen.add(rollout.rollout_id)
        group = self.groups[rollout.group_id]
        group.append(rollout)
        self._bound_incomplete_groups()
        if len(group) == rollout.group_size:
            del self.groups[rollout.group_id]
            self.ready.extend(self.score_group(group))
        batches = []
        while (sequences := self._take_batch()) is not None:
            batches.append(self.make_batch(sequences))
        return batches

    def _group_problem(self, rollout: Rollout) -> str | None:
        if rollout.rollout_id in self.seen:
            return "duplicate rollout id"
        if rollout.problem_id not in self.problems:
            return f"unknown problem {rollout.problem_id[:64]!r}"
        if self.group_size is not None and rollout.group_size != self.group_size:
            return f"group size {rollout.group_size}, where this run's groups have {self.group_size}"
        if rollout.group_id in self.evicted:
            return "its group was dropped incomplete"
        members = self.groups.get(rollout.group_id)
        first = members[0] if members else None
        if first and (first.group_size, first.problem_id) != (rollout.group_size, rollout.problem_id):
            return "its group's other members name another problem or group size"
        return None

    def _bound_incomplete_groups(self) -> None:
        """Drop the oldest incomplete groups beyond ``max_incomplete_groups``: a group whose members
        never all come (a lost actor, a stranger's rollouts) must not hold memory for ever."""
        if self.max_incomplete_groups is None:
            return
        while len(self.groups) > self.max_incomplete_groups:
            group_id, members = next(iter(self.groups.items()))
            del self.groups[group_id]
            self._drop(group_id, "incomplete_group", len(members))
            self.evicted[group_id] = None
            while len(self.evicted) > self.max_incomplete_groups:
                self.evicted.popitem(last=False)
            logger.warning(
                "group %r dropped incomplete (%d of %d members): more than %d groups were incomplete",
                group_id[:64],
                len(members),
                members[0].group_size,
                self.max_incomplete_groups,
            )

    def _take_batch(self) -> list[TrainSequence] | None:
        """The next batch's sequences, in arrival order, without those too stale for its step."""
        trained_at = self.start_version + self.batches_made // self.ranks
        chosen: list[TrainSequence] = []
        taken = 0
        for sequence in self.ready:
            if len(chosen) == self.batch_size:
                break
            taken += 1
            versions = sequence.token_versions
            if self.max_lag is not None and len(versions) and trained_at - int(versions.min()) > self.max_lag:
                self._drop(sequence.group_id, "stale", 1)  # only gets staler: dropped for good
                logger.info(
                    "rollout %s dropped: lag %d > rl.max_lag",
                    sequence.rollout_id,
                    trained_at - int(versions.min()),
                )
                continue
            chosen.append(sequence)
        self.ready = self.ready[taken:]
        if len(chosen) < self.batch_size:
            self.ready = chosen + self.ready
            return None
        return chosen

    @property
    def buffered(self) -> int:
        """Rollouts received and not yet sent in a batch."""
        return sum(len(group) for group in self.groups.values()) + len(self.ready)

    def score_group(self, group: list[Rollout]) -> list[TrainSequence]:
        scores = [safe_score(self.task, self.problems[r.problem_id], r.completion_text) for r in group]
        self.labels.update(score.label for score in scores)
        rewards = [
            self.rewards.reward(score, r.finished, len(r.completion_token_ids))
            for score, r in zip(scores, group, strict=True)
        ]
        if self.drop_zero_variance_groups and len(set(rewards)) == 1:
            self._drop(group[0].group_id, "zero_variance", len(group))  # equal rewards: no signal
            return []
        advantages = leave_one_out_advantages(
            np.array([rewards], dtype=np.float32), normalize_std=self.normalize_advantages
        )[0].tolist()
        advantages = [
            self.rewards.advantage(advantage, r.finished)
            for advantage, r in zip(advantages, group, strict=True)
        ]
        return [
            TrainSequence(
                rollout_id=r.rollout_id,
                group_id=r.group_id,
                prompt_token_ids=r.prompt_token_ids,
                completion_token_ids=r.completion_token_ids,
                behaviour_logprobs=r.behaviour_logprobs,
                token_versions=r.token_versions,
                reward=reward,
                advantage=advantage,
                finished=r.finished,
            )
            for r, reward, advantage in zip(group, rewards, advantages, strict=True)
        ]

    def make_batch(self, sequences: list[TrainSequence]) -> TrainBatch:
        lengths = [len(s.prompt_token_ids) + len(s.completion_token_ids) for s in sequences]
        batch = TrainBatch(
            batch_index=self.batches_made,
            sequences=sequences,
            micro_batches=pack_micro_batches(lengths, self.micro_batch_tokens),
            created_at=time.time(),
        )
        self.batches_made += 1
        return batch


@dataclass
class RoundBarrier:
    """Pure logic: conventional rounds as the paper runs them, generation first, then training.

    Batches are held until the whole round (G steps' worth) is built, then handed out together;
    with ``batches_per_round = 1`` every batch passes at once."""

    batches_per_round: int
    held: list[TrainBatch] = field(default_factory=list)

    def add(self, batches: list[TrainBatch]) -> list[TrainBatch]:
        """Take newly built batches; return those whose round is now complete, in order."""
        self.held.extend(batches)
        complete = len(self.held) - len(self.held) % self.batches_per_round
        released, self.held = self.held[:complete], self.held[complete:]
        return released


@dataclass
class EvalScorer:
    """Eval rollouts (``split="eval"``): scored, never trained, closed into one record per round and set."""

    sets: dict[str, EvalSet]
    samples: int
    rejected: int = 0

    def __post_init__(self) -> None:
        self.rounds = EvalCollector(self.samples)

    def add(self, rollout: Rollout) -> dict[str, Any] | None:
        parsed = parse_eval_group_id(rollout.group_id)
        eval_set = self.sets.get(parsed[0]) if parsed is not None else None
        problem = eval_set.by_id.get(rollout.problem_id) if eval_set is not None else None
        if eval_set is None or problem is None:
            self.rejected += 1
            logger.warning(
                "eval rollout %s: unknown problem or round %s", rollout.rollout_id, rollout.group_id
            )
            return None
        score = safe_score(eval_set.task, problem, rollout.completion_text)
        versions = rollout.token_versions
        mixed = len(versions) > 0 and int(versions.min()) != int(versions.max())
        return self.rounds.add(
            rollout.group_id,
            rollout.group_size,
            problem.problem_id,
            score,
            len(rollout.completion_token_ids),
            mixed,
        )


def batches_per_round(config: PipelineConfig) -> int:
    """How many batches the preprocessor gathers before handing any out (1: no barrier)."""
    if config.run.mode == "conventional" and not config.run.train_during_round:
        return config.run.steps_per_round * config.trainer.num_processes
    return 1


def steps_ahead_allowed(config: PipelineConfig) -> int:
    """How many steps past the trainer's latest published version a batch may be handed out for.

    Conventional mode publishes once per round of G steps, so the whole round must be allowed."""
    extra = config.run.steps_per_round - 1 if config.run.mode == "conventional" else 0
    return config.transport.batches_ahead + extra


@dataclass
class TrainerProgress:
    """The trainer's policy version as its weight notices tell it, and what it allows to be sent."""

    start_version: int
    steps_ahead: int
    version: int = -1

    def __post_init__(self) -> None:
        self.version = max(self.version, self.start_version)

    def may_send(self, step: int) -> bool:
        """Whether the batch for ``step`` (counted from this start) may go to the trainer now."""
        return step - (self.version - self.start_version) < self.steps_ahead

    def read(self, notices: Receiver, timeout_s: float = 0.0) -> bool:
        """Take in every notice waiting (the first up to ``timeout_s``); True on Shutdown."""
        while (notice := notices.recv(timeout_s=timeout_s)) is not None:
            timeout_s = 0.0
            if isinstance(notice, Shutdown):
                logger.info("shutdown: %s", notice.reason)
                return True
            if isinstance(notice, WeightUpdate):
                self.version = max(self.version, notice.policy_version)
        return False


def incomplete_groups_bound(config: PipelineConfig) -> int:
    """How many incomplete train groups the preprocessor keeps before dropping the oldest.

    An actor submits a group's G samples together and keeps at most max(H, G) samples in flight, so
    at most that many / G of its groups are incomplete here at once; four times that (rollouts in
    the queues too), plus a margin, is never reached by the actors of a healthy run."""
    in_flight = max(config.actor.max_in_flight, config.rl.group_size)
    return 4 * config.actor.num_actors * -(-in_flight // config.rl.group_size) + 16


def final_counts_path(run_dir: Path) -> Path:
    """The preprocessor's counts when it stopped (``rejection_counts`` and what it received)."""
    return run_dir / "preprocessor.final.json"


def rejection_counts(
    builder: BatchBuilder, rollouts: Receiver, notices: Receiver, inboxes: Sequence[Sender] = ()
) -> dict[str, int]:
    """Everything this stage refused so far, as it goes into ``preprocessor.jsonl`` (running counts)."""
    return {
        # The receivers reject replayed message numbers; the builder, impossible values.
        registry.PREPROCESSOR_REJECTED: builder.rejected + rollouts.rejected_count + notices.rejected_count,
        registry.PREPROCESSOR_MALFORMED: rollouts.malformed_count + notices.malformed_count,
        registry.PREPROCESSOR_PEER_DISCONNECTS: rollouts.peer_disconnects,
        registry.PREPROCESSOR_LOST: rollouts.lost_count,
        registry.PREPROCESSOR_LOST_FROM_ACTORS: rollouts.senders_lost_count,
        # Peers refused in the CurveZMQ handshake (no keys, other keys): none of their frames was read,
        # and none was sent to them (a stranger connecting to a trainer's inbox to take its batches).
        registry.PREPROCESSOR_UNAUTHENTICATED: rollouts.unauthenticated_count
        + notices.unauthenticated_count
        + sum(inbox.unauthenticated_count for inbox in inboxes),
        **{
            registry.name_of(registry.SAMPLES_DROPPED, reason=reason): builder.dropped[reason]
            for reason in ("stale", "zero_variance", "incomplete_group")
        },
    }


def build_batch_builder(
    config: PipelineConfig, run_dir: Path, task: Task, problems: dict[str, Problem]
) -> BatchBuilder:
    """The run's batch builder over ``problems`` of ``task``, every limit of its boundary from ``config``."""
    return BatchBuilder(
        task=task,
        problems=problems,
        # With several trainer ranks each step takes one shard of B/ranks sequences from each rank.
        batch_size=config.rl.batch_size // config.trainer.num_processes,
        micro_batch_tokens=config.trainer.micro_batch_tokens,
        normalize_advantages=config.rl.normalize_advantages,
        rewards=RewardPolicy(
            truncated=config.rl.truncated,
            truncated_penalty=config.rl.truncated_penalty,
            format_reward=config.rl.format_reward,
            overlong_buffer=config.rl.overlong.buffer if config.rl.overlong.enabled else None,
            max_length=config.actor.max_new_tokens,
        ),
        drop_zero_variance_groups=config.rl.drop_zero_variance_groups,
        max_lag=config.rl.max_lag,
        start_version=starting_version(config.run.resume_from),
        ranks=config.trainer.num_processes,
        run_id=run_dir.name,
        group_size=config.rl.group_size,
        max_incomplete_groups=incomplete_groups_bound(config),
        max_completion_tokens=config.actor.max_new_tokens,
    )


def rollout_receiver(context: Any, config: PipelineConfig, keys: CurveKeys) -> Receiver:
    """The rollout PULL the preprocessor binds: the run's keys, and the actors' streams pinned by their
    sender names (``numbering``), so their losses are ``preprocessor/lost_from_actors``."""
    transport = config.transport
    return Receiver(
        context,
        transport.address("rollouts"),
        "pull",
        bind=True,
        high_water_mark=transport.queue_size,
        keys=keys,
        kernel_buffer_bytes=transport.socket_buffer_kib * 1024,
        max_message_bytes=transport.max_message_bytes,
        senders=[actor_sender(actor_id) for actor_id in range(config.actor.num_actors)],
    )


def run(config: PipelineConfig, run_dir: Path) -> None:
    task = build_task(config.task)
    problems = {p.problem_id: p for p in task.problems("train", config.task.train_problems, config.run.seed)}
    evals = None
    if config.eval.every:
        evals = EvalScorer(build_eval_sets(config, task), config.eval.samples)
    builder = build_batch_builder(config, run_dir, task, problems)
    context = zmq.Context()
    transport = config.transport
    keys = run_keys(run_dir)  # every run authenticates its peers, on loopback too
    rollouts = rollout_receiver(context, config, keys)
    # A small queue towards each trainer rank: when it is busy, rollouts back up to the actors.
    # Shard i of the stream goes to rank i % ranks, so every optimizer step trains B sequences.
    # The preprocessor binds them (every bound socket of a run is on trainer node 0, at
    # transport.host); each rank connects to its own.
    inboxes = [
        Sender(
            context,
            transport.trainer_inbox(rank),
            "push",
            bind=True,
            high_water_mark=1,
            keys=keys,
            kernel_buffer_bytes=transport.socket_buffer_kib * 1024,
            max_message_bytes=transport.max_message_bytes,
            name=f"preprocessor-to-rank{rank}",
        )
        for rank in range(config.trainer.num_processes)
    ]
    notices = Receiver(
        context,
        transport.address("weights"),
        "sub",
        bind=False,
        keys=keys,
        max_message_bytes=transport.max_message_bytes,
    )
    trainer = TrainerProgress(starting_version(config.run.resume_from), steps_ahead_allowed(config))
    barrier = RoundBarrier(batches_per_round(config))
    metrics = JsonlWriter(run_dir / "preprocessor.jsonl")
    eval_records = JsonlWriter(run_dir / "eval.jsonl")
    dropped = JsonlWriter(dropped_prompts_path(run_dir))  # which prompt lost what, and why (runs audit)
    try:
        while True:
            if trainer.read(notices):
                return
            message = rollouts.recv(timeout_s=0.5)
            if isinstance(message, Rollout) and builder.check(message, trainer.version) is not None:
                # Tokens newer than the trainer's version may only mean its notice is still queued.
                if trainer.read(notices):
                    return
                if (reason := builder.check(message, trainer.version)) is not None:
                    builder.reject(message, reason)
                    continue
            if isinstance(message, Rollout) and message.split == "eval":
                if evals is None:
                    builder.rejected += 1
                    logger.warning("eval rollout %s while eval.every is 0: rejected", message.rollout_id)
                elif (record := evals.add(message)) is not None:
                    eval_records.write(record)
                    logger.info(
                        "eval %s at v%d: pass@1 %.3f",
                        record[registry.EVAL_SET],
                        record[registry.POLICY_VERSION],
                        record[registry.name_of(registry.EVAL_PASS_AT, k=1)],
                    )
            elif isinstance(message, Rollout):
                built, drops, builder.drops = builder.add(message, trainer.version), builder.drops, []
                for drop in drops:
                    dropped.write({**drop, registry.TIME: time.time()})
                for batch in barrier.add(built):
                    step = batch.batch_index // len(inboxes)  # the optimizer step it feeds
                    # Hold the batch (and so, upstream, the actors) until the trainer is close enough.
                    held_from = time.monotonic()
                    while not trainer.may_send(step):
                        if trainer.read(notices, timeout_s=0.2):
                            return
                    held_s = time.monotonic() - held_from
                    inbox = inboxes[batch.batch_index % len(inboxes)]
                    while not inbox.send(batch, timeout_s=1.0):
                        if trainer.read(notices):
                            return
                    metrics.write(
                        {
                            registry.BATCH_INDEX: batch.batch_index,
                            registry.STEP: step,
                            registry.TRAINER_VERSION: trainer.version,
                            # waiting for the trainer to catch up
                            registry.PREPROCESSOR_HELD_S: held_s,
                            registry.TIME: time.time(),
                            registry.QUEUE_ROLLOUTS: builder.buffered,
                            registry.PREPROCESSOR_BATCHES_BUILT: builder.batches_made,
                            **{
                                registry.name_of(registry.SCORES, label=label): builder.labels[label]
                                for label in LABELS
                            },
                            **rejection_counts(builder, rollouts, notices, inboxes),
                        }
                    )
            elif message is not None:
                builder.rejected += 1
                logger.warning("rejected an unexpected %s on the rollout socket", type(message).__name__)
    finally:
        final = rejection_counts(builder, rollouts, notices, inboxes)
        logger.info(
            "preprocessor: %d batches, labels %s, rejections %s",
            builder.batches_made,
            dict(builder.labels),
            final,
        )
        # preprocessor.jsonl has a record per batch sent; what came after the last one (input read while
        # the trainer finished) is counted here, so the run's files hold every count.
        final_counts_path(run_dir).write_text(
            json.dumps(
                {
                    **final,
                    registry.PREPROCESSOR_RECEIVED: rollouts.received_count,
                    # Of those, from the actors' own (pinned) streams: 0 would mean pinning missed them.
                    registry.PREPROCESSOR_RECEIVED_FROM_ACTORS: rollouts.senders_received_count,
                    registry.PREPROCESSOR_BATCHES_BUILT: builder.batches_made,
                    registry.TIME: time.time(),
                }
            )
        )
        for socket in (rollouts, notices, *inboxes):
            socket.close()
        metrics.close()
        eval_records.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s preprocessor %(levelname)s %(message)s")
    config = PipelineConfig.model_validate_json((args.run_dir / "config.json").read_text())
    run(config, args.run_dir)


if __name__ == "__main__":
    main()
