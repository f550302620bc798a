"""A discrete-event model of one run of the platform: engines, the queue, the trainer, weight updates.

What is modelled, as the platform does it (``workers/``):

* **Engines**: each holds up to H sequences and writes one token of each per decode step
  (``CostModel.decode_step_s``). Between two events nothing joins or leaves, so a run of decode steps
  is one event (``CostModel.decode_steps_s``), cut short when a weight update arrives: the step in
  progress ends, then the engine pauses (``update_pause_s``) and loads the new version **in flight**;
  the sequences it holds go on under it, so a sequence may be written by several versions.
  With ``recompute`` the engine also prefills every token it holds again under the new weights.
* **Admission**, in whole groups (the ``group_size`` samples of one prompt, admitted together;
  a group larger than H goes alone): ``pipeline`` refills free slots at once (a prefill per prompt
  token); ``async`` too, but an update is not loaded in flight: once the engine is ``drain_lag``
  versions behind it admits nothing until its sequences have finished, then loads; ``conventional``
  generates rounds of B·G sequences with one version: a round's prompts are admitted only by engines
  holding that round's weights, and the next round starts when its weights arrive.
* **The queue**: a group is ready for the trainer when its last sample has finished; ready sequences
  wait in the order their groups completed, at most ``queue_capacity`` of them; an engine whose
  finished sequences find it full stops until there is room (the backpressure ``transport.queue_size``
  and ``transport.batches_ahead`` give a run).
* **The preprocessor** builds a batch of B ready sequences as soon as they are there, while fewer than
  ``batches_ahead`` batches are built or training (``transport.batches_ahead``; conventional mode adds
  G - 1): with 2, a batch's sequences are chosen a step before it trains.
* **The trainer** trains the built batches in order (``CostModel.train_step_s``): in ``pipeline`` mode
  publishing after every step; in ``conventional`` mode G steps per round, publishing after
  the G-th, taking the round's first steps while it is still generated only with ``train_during_round``.
  A publication holds the trainer for the transfer (``transfer_s``); the engines get the weights when it
  ends. ``max_lag`` drops a sequence with a token more than that many versions older than the policy
  its batch would train, as the preprocessor does.

Not modelled yet: several trainer ranks apart from their step time.

The figures (``SimulatedRun``) are those a run reports: samples and tokens per second, the engines'
idle and paused shares of their time, the trainer's idle share, the lag of every trained token (the
trainer's version at the step that trains it minus the version that sampled it), the sequences written
by two or more versions, and the mean lag by token position.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from pipelinerl.plan.costs import CostModel
from pipelinerl.plan.workload import Workload

POSITION_BINS = 10  # the lag by token position: the longest completion cut in this many equal spans


@dataclass(frozen=True)
class SimulatedRun:
    seconds: float  # from the start to the end of the last optimizer step
    samples: int  # sequences trained
    samples_per_s: float
    tokens_per_s: float  # completion tokens trained per second
    actor_idle: float  # share of the engines' time with nothing to decode (waiting for work or room)
    actor_paused: float  # share of the engines' time spent taking weights in
    trainer_idle: float  # share of the time the trainer waited for a batch
    # From the end of the first step to the end of the last: the pipeline once filled (what a run's
    # records measure best: its stages start at different times).
    steady_samples_per_s: float
    steady_trainer_idle: float
    lag_mean: float
    lag_p90: int
    lag_max: int
    multi_version_sequences: int  # trained sequences written by two or more versions
    dropped_stale: int  # sequences max_lag dropped
    lag_tokens: dict[int, int]  # lag -> trained tokens with that lag
    # The mean lag of the trained tokens at each span of positions: (first position, mean lag), the
    # longest completion cut in POSITION_BINS spans (a span no token reached is left out).
    lag_by_position: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class _Sequence:
    length: int
    group: int
    start: int  # the engine's decode-step count when it was admitted: it ends at start + length
    versions: list[list[int]] = field(default_factory=list)  # [version, tokens] in order, once finished


@dataclass
class _Chunk:
    """Decode steps under way: from ``start`` for ``steps`` steps of ``in_flight`` sequences."""

    start: float
    steps: int
    in_flight: int
    context: int


@dataclass
class _Engine:
    """An engine's sequences are kept by the decode step they end at (a heap), so a run of decode steps
    costs O(log H) whatever H is: every sequence in flight gains a token per step, so the engine counts
    its steps (``steps``) and a sequence's tokens are the steps since it started; which version wrote
    which of them is read off the engine's ``timeline`` of loads when it finishes."""

    slots: dict[int, _Sequence] = field(default_factory=dict)
    ends: list[tuple[int, int]] = field(default_factory=list)  # heap of (the step it ends at, its key)
    starts: int = 0  # the sum of the slots' ``start``: their context is n·prompt + n·steps - starts
    steps: int = 0  # decode steps taken
    timeline_at: list[int] = field(default_factory=lambda: [0])  # the step from which each version writes
    timeline: list[int] = field(default_factory=lambda: [0])  # ... and that version
    version: int = 0
    pending: int | None = None  # a version that has arrived and is not loaded yet
    draining: bool = False  # async mode: admitting nothing until its sequences finish, then loading
    chunk: _Chunk | None = None
    outbox: list[_Sequence] = field(default_factory=list)  # finished, waiting for room in the queue
    waiting_since: float | None = None  # idle (nothing to do) or blocked (no room) since then
    generation: int = 0  # bumps when its scheduled event is replaced
    idle_s: float = 0.0
    paused_s: float = 0.0


_ENGINE, _TRAINER = 0, 1  # what an event ends: an engine's work, or the trainer's


def written_by(engine: _Engine, start: int, end: int) -> list[list[int]]:
    """[version, tokens] of the engine's decode steps ``start`` to ``end``, from its timeline of loads."""
    index = bisect.bisect_right(engine.timeline_at, start) - 1
    written: list[list[int]] = []
    while index < len(engine.timeline_at) and engine.timeline_at[index] < end:
        following = engine.timeline_at[index + 1] if index + 1 < len(engine.timeline_at) else end
        tokens = min(following, end) - max(engine.timeline_at[index], start)
        if tokens > 0:
            written.append([engine.timeline[index], tokens])
        index += 1
    return written


class _Simulation:
    def __init__(self, workload: Workload, costs: CostModel, seed: int) -> None:
        self.w, self.costs = workload, costs
        self.rng = np.random.default_rng(seed)
        self.now = 0.0
        self.events: list[tuple[float, int, int, int, int]] = []  # time, order, kind, engine, generation
        self.order = 0
        self.engines = [_Engine() for _ in range(workload.engines)]
        self.queue: deque[_Sequence] = deque()  # ready: sequences of complete groups
        self.batches: deque[list[_Sequence]] = deque()  # built by the preprocessor, not yet training
        self.incomplete: dict[int, list[_Sequence]] = {}  # group -> its finished samples so far
        self.groups = 0  # groups admitted
        self.sequences = 0  # sequences admitted (each one's key)
        self.version = 0  # the trainer's policy version: optimizer steps taken
        self.trainer: Literal["waiting", "training", "publishing"] = "waiting"
        self.trainer_waiting_since: float | None = 0.0
        self.trainer_idle_s = 0.0
        self.end: float | None = None
        self.first_step: tuple[float, float] | None = None  # its end, and the trainer's idle time then
        # conventional mode: the round's version, prompts not yet admitted, sequences not yet finished
        self.round_version = 0
        self.round_prompts = workload.round_size
        self.round_unfinished = self.round_prompts
        self.steps_in_round = 0  # conventional mode: steps taken on the round being trained
        self.lag_tokens: Counter[int] = Counter()
        self.bin_width = max(1, -(-int(workload.lengths.longest) // POSITION_BINS))
        self.position_lag = np.zeros((POSITION_BINS, 2))  # per span: the lags summed, the tokens
        self.trained_samples = self.trained_tokens = self.multi_version = self.dropped = 0

    # ----- the event queue ----------------------------------------------------------------------------

    def schedule(self, at: float, kind: int, subject: int = 0) -> None:
        generation = self.engines[subject].generation if kind == _ENGINE else 0
        heapq.heappush(self.events, (at, self.order, kind, subject, generation))
        self.order += 1

    def run(self) -> SimulatedRun:
        for index in range(self.w.engines):
            self.schedule(0.0, _ENGINE, index)
        while self.end is None:
            if not self.events:
                raise RuntimeError(f"the simulated run stalled at version {self.version}, t={self.now:.3f} s")
            self.now, _, kind, subject, generation = heapq.heappop(self.events)
            if kind == _ENGINE:
                if generation == self.engines[subject].generation:
                    self.engine_ready(subject)
            else:
                self.trainer_ready()
        return self.figures()

    # ----- engines ------------------------------------------------------------------------------------

    def engine_ready(self, index: int) -> None:
        engine = self.engines[index]
        if engine.waiting_since is not None:
            engine.idle_s += self.now - engine.waiting_since
            engine.waiting_since = None
        if engine.chunk is not None:
            self.finish_chunk(engine)
        if not self.flush(engine):
            engine.waiting_since = self.now  # blocked: the queue is full
            return
        if self.loads_now(engine):  # between two decode steps: take the new weights in
            assert engine.pending is not None
            engine.version, engine.pending = engine.pending, None
            engine.timeline_at.append(engine.steps)
            engine.timeline.append(engine.version)
            pause = self.costs.update_pause_s
            if self.w.recompute:  # the cached prefixes again, under the new weights
                pause += self.costs.prefill_per_token_s * self.context(engine)
            engine.paused_s += pause
            self.schedule(self.now + pause, _ENGINE, index)
            return
        admitted = 0 if engine.draining else self.admit(engine)
        if admitted:
            prefill = self.costs.prefill_per_token_s * self.w.prompt_tokens * admitted * self.w.group_size
            self.schedule(self.now + prefill, _ENGINE, index)
            return
        if engine.slots:
            steps = engine.ends[0][0] - engine.steps
            in_flight = len(engine.slots)
            context = self.context(engine)
            engine.chunk = _Chunk(self.now, steps, in_flight, context)
            self.schedule(self.now + self.costs.decode_steps_s(steps, in_flight, context), _ENGINE, index)
            return
        engine.waiting_since = self.now  # nothing to do until weights or a round arrive

    def context(self, engine: _Engine) -> int:
        """The tokens the engine's sequences in flight hold: their prompts and what they wrote."""
        return len(engine.slots) * (self.w.prompt_tokens + engine.steps) - engine.starts

    def loads_now(self, engine: _Engine) -> bool:
        """Whether the engine takes the weights that arrived in now: at once, except in async mode,
        where it drains first once they are ``drain_lag`` versions ahead (``ContinuousAdmission``)."""
        if engine.pending is None:
            return False
        if self.w.mode != "async":
            return True
        if engine.pending - engine.version >= self.w.drain_lag:
            engine.draining = True
        if engine.draining and not engine.slots:
            engine.draining = False
            return True
        return False

    def finish_chunk(self, engine: _Engine) -> None:
        assert engine.chunk is not None
        engine.steps += engine.chunk.steps
        engine.chunk = None
        while engine.ends and engine.ends[0][0] == engine.steps:
            _, key = heapq.heappop(engine.ends)
            sequence = engine.slots.pop(key)
            engine.starts -= sequence.start
            sequence.versions = written_by(engine, sequence.start, engine.steps)
            engine.outbox.append(sequence)

    def flush(self, engine: _Engine) -> bool:
        """Move the engine's finished sequences into the queue while there is room; True when all went."""
        readied = False
        while engine.outbox and len(self.queue) < self.w.capacity:
            sequence = engine.outbox.pop(0)
            group = self.incomplete.setdefault(sequence.group, [])
            group.append(sequence)
            if len(group) == self.w.group_size:  # the group's last sample: the group is ready
                self.queue.extend(self.incomplete.pop(sequence.group))
                self.round_unfinished -= self.w.group_size
                readied = True
        if readied:
            self.trainer_try_start()
        return not engine.outbox

    def admit(self, engine: _Engine) -> int:
        """Admit whole groups into free slots (a group larger than H alone); returns the prompts."""
        size = self.w.group_size
        groups = max(0, (max(self.w.in_flight, size) - len(engine.slots)) // size)
        if self.w.mode == "conventional":
            groups = min(groups, self.round_prompts // size) if engine.version == self.round_version else 0
            self.round_prompts -= groups * size
        for _ in range(groups):
            for length in self.w.lengths.sample(self.rng, size):
                sequence = _Sequence(int(length), self.groups, engine.steps)
                engine.slots[self.sequences] = sequence
                heapq.heappush(engine.ends, (engine.steps + sequence.length, self.sequences))
                engine.starts += engine.steps
                self.sequences += 1
            self.groups += 1
        return groups

    def update_arrives(self, version: int) -> None:
        for index, engine in enumerate(self.engines):
            engine.pending = version
            chunk = engine.chunk
            if (
                chunk is not None and self.w.mode != "async"
            ):  # the step under way ends, then the engine takes the weights
                elapsed = self.now - chunk.start
                done = self.costs.steps_within(elapsed, chunk.in_flight, chunk.context, chunk.steps)
                between = self.costs.decode_steps_s(done, chunk.in_flight, chunk.context) == elapsed
                steps = min(chunk.steps, done if between else done + 1)
                if steps < chunk.steps:
                    chunk.steps = steps
                    engine.generation += 1
                    end = chunk.start + self.costs.decode_steps_s(steps, chunk.in_flight, chunk.context)
                    self.schedule(end, _ENGINE, index)
            elif engine.waiting_since is not None and not engine.outbox:
                engine.generation += 1
                self.schedule(self.now, _ENGINE, index)

    def wake_blocked(self) -> None:
        for index, engine in enumerate(self.engines):
            if engine.outbox:
                engine.generation += 1
                self.schedule(self.now, _ENGINE, index)

    # ----- the trainer --------------------------------------------------------------------------------

    def build_batches(self) -> None:
        """The preprocessor: B ready sequences make a batch as soon as they are there, while fewer than
        ``batches_ahead`` batches are built or training (so with 2, one waits while one trains: a
        batch's sequences are chosen a step before it trains). ``max_lag`` drops a sequence against the
        version its batch will train at; a strict round is held back until it is whole."""
        if self.w.waits_for_round and self.round_unfinished > 0:
            return
        while len(self.queue) >= self.w.batch_size:
            ahead = len(self.batches) + (self.trainer == "training")
            if ahead >= self.w.ahead:
                return
            if self.w.max_lag is not None:
                trains_at = self.version + ahead
                kept = [s for s in self.queue if trains_at - s.versions[0][0] <= self.w.max_lag]
                if len(kept) < len(self.queue):
                    self.dropped += len(self.queue) - len(kept)
                    self.queue = deque(kept)
                    self.wake_blocked()  # room again
                    continue
            self.batches.append([self.queue.popleft() for _ in range(self.w.batch_size)])
            self.wake_blocked()

    def trainer_try_start(self) -> None:
        self.build_batches()
        if self.trainer != "waiting" or not self.batches:
            return
        batch = self.batches.popleft()
        assert self.trainer_waiting_since is not None
        self.trainer_idle_s += self.now - self.trainer_waiting_since
        self.trainer_waiting_since = None
        tokens = 0
        for sequence in batch:
            position = 0
            for version, count in sequence.versions:
                self.lag_tokens[self.version - version] += count
                self.count_positions(position, position + count, self.version - version)
                position += count
            tokens += sequence.length
            self.multi_version += len(sequence.versions) > 1
        self.trained_samples += len(batch)
        self.trained_tokens += tokens
        self.trainer = "training"
        self.schedule(self.now + self.costs.train_step_s(tokens, len(batch)), _TRAINER)
        self.build_batches()

    def count_positions(self, first: int, end: int, lag: int) -> None:
        """Count the tokens at positions ``first`` to ``end`` (exclusive), trained at ``lag``, by span."""
        width = self.bin_width
        while first < end:
            span = min(first // width, POSITION_BINS - 1)
            last = end if span == POSITION_BINS - 1 else min(end, (span + 1) * width)
            self.position_lag[span] += (lag * (last - first), last - first)
            first = last

    def trainer_ready(self) -> None:
        """The trainer's step or its publication ended."""
        if self.trainer == "training":
            self.version += 1
            self.steps_in_round += 1
            if self.first_step is None:
                self.first_step = (self.now, self.trainer_idle_s)
            if self.version == self.w.steps:
                self.end = self.now
                return
            if self.w.mode == "pipeline" or self.steps_in_round == self.w.steps_per_round:
                self.trainer = "publishing"  # the broadcast holds the trainer
                self.schedule(self.now + self.costs.transfer_s, _TRAINER)
                return
        elif self.trainer == "publishing":
            if self.w.mode == "conventional":  # the next round, generated with these weights
                self.round_version, self.steps_in_round = self.version, 0
                self.round_prompts = self.round_unfinished = self.w.round_size
            self.update_arrives(self.version)
        self.trainer = "waiting"
        self.trainer_waiting_since = self.now
        self.trainer_try_start()

    # ----- the figures --------------------------------------------------------------------------------

    def figures(self) -> SimulatedRun:
        seconds = self.end or 0.0
        for engine in self.engines:
            if engine.waiting_since is not None:
                engine.idle_s += seconds - engine.waiting_since
        engine_time = seconds * len(self.engines)
        total = sum(self.lag_tokens.values())
        lags = sorted(self.lag_tokens)
        cumulative, p90 = 0, 0
        for lag in lags:
            cumulative += self.lag_tokens[lag]
            if cumulative >= 0.9 * total:
                p90 = lag
                break
        first_end, idle_then = self.first_step or (0.0, 0.0)
        steady = seconds - first_end
        return SimulatedRun(
            seconds=seconds,
            samples=self.trained_samples,
            samples_per_s=self.trained_samples / seconds if seconds else 0.0,
            tokens_per_s=self.trained_tokens / seconds if seconds else 0.0,
            actor_idle=sum(e.idle_s for e in self.engines) / engine_time if engine_time else 0.0,
            actor_paused=sum(e.paused_s for e in self.engines) / engine_time if engine_time else 0.0,
            trainer_idle=self.trainer_idle_s / seconds if seconds else 0.0,
            steady_samples_per_s=(self.trained_samples - self.w.batch_size) / steady if steady else 0.0,
            steady_trainer_idle=(self.trainer_idle_s - idle_then) / steady if steady else 0.0,
            lag_mean=sum(lag * n for lag, n in self.lag_tokens.items()) / total if total else 0.0,
            lag_p90=p90,
            lag_max=lags[-1] if lags else 0,
            multi_version_sequences=self.multi_version,
            dropped_stale=self.dropped,
            lag_tokens=dict(sorted(self.lag_tokens.items())),
            lag_by_position=[
                (span * self.bin_width, float(lags / tokens))
                for span, (lags, tokens) in enumerate(self.position_lag)
                if tokens
            ],
        )


def simulate(workload: Workload, costs: CostModel, seed: int = 0) -> SimulatedRun:
    """Simulate ``workload`` under ``costs`` until the trainer's ``workload.steps``-th step ends."""
    return _Simulation(workload, costs, seed).run()
