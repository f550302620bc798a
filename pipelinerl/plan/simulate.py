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
from typing import Literal, NamedTuple

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
    in_flight: int = 0  # the most sequences an engine held at once (H, or less where the KV cache caps it)


class _Sequence(NamedTuple):
    """A finished sequence: its group, the engine that wrote it and the steps of that engine it spans."""

    group: int
    engine: int
    start: int  # the engine's decode-step count when it was admitted
    end: int  # ... and when it finished: it holds end - start tokens
    first_version: int  # the version that wrote its first token (what ``max_lag`` judges it by)


@dataclass(slots=True)
class _Chunk:
    """Decode steps under way: from ``start`` for ``steps`` steps of ``in_flight`` sequences."""

    start: float
    steps: int
    in_flight: int
    context: int
    scale: float = 1.0  # the share of the measured decode time its steps take (stages sharing cores)


@dataclass(slots=True)
class _Engine:
    """An engine's sequences are kept by the decode step they end at (a heap), so a run of decode steps
    costs O(log H) whatever H is: every sequence in flight gains a token per step, so the engine counts
    its steps (``steps``) and a sequence's tokens are the steps since it started; which version wrote
    which of them is read off the engine's ``timeline`` of loads when it is trained."""

    index: int = 0
    ends: list[tuple[int, int, int, int]] = field(default_factory=list)  # heap: (end, key, group, start)
    starts: int = 0  # the sum of the sequences' starts: their context is n·prompt + n·steps - starts
    steps: int = 0  # decode steps taken
    timeline_at: list[int] = field(default_factory=lambda: [0])  # the step from which each version writes
    timeline: list[int] = field(default_factory=lambda: [0])  # ... and that version
    version: int = 0
    pending: int | None = None  # a version that has arrived and is not loaded yet
    draining: bool = False  # async mode: admitting nothing until its sequences finish, then loading
    chunk: _Chunk | None = None
    outbox: deque[_Sequence] = field(default_factory=deque)  # finished, waiting for room in the queue
    waiting_since: float | None = None  # idle (nothing to do) or blocked (no room) since then
    generation: int = 0  # bumps when its scheduled event is replaced
    idle_s: float = 0.0
    paused_s: float = 0.0


_ENGINE, _TRAINER = 0, 1  # what an event ends: an engine's work, or the trainer's
_ROW = 1 << 40  # more decode steps than an engine takes: engine e's steps are keyed e·_ROW + step


class _Timelines:
    """The engines' timelines of loads (``_Engine.timeline_at``, ``timeline``) in two arrays, row e for
    engine e, so that the trainer splits a whole batch's tokens by the versions that wrote them at once
    (``split``). A load's step is kept as the key e·_ROW + step and a row's unused cells as
    (e + 1)·_ROW - 1: the flattened keys are sorted, so a searchsorted finds the load in force at any
    step of any engine."""

    def __init__(self, engines: int, capacity: int = 64) -> None:
        self.loads = [1] * engines  # each engine's loads so far: the first, version 0 from step 0
        self.keys = self.unused(engines, capacity)
        self.keys[:, 0] = np.arange(engines) * _ROW
        self.versions = np.zeros((engines, capacity), dtype=np.int64)

    @staticmethod
    def unused(engines: int, capacity: int) -> np.ndarray:
        return np.repeat(np.arange(1, engines + 1, dtype=np.int64)[:, None] * _ROW - 1, capacity, axis=1)

    def load(self, engine: int, step: int, version: int) -> None:
        index = self.loads[engine]
        if index + 1 == self.keys.shape[1]:  # double, keeping an unused cell in every row: its last bound
            engines, capacity = self.keys.shape
            self.keys = np.concatenate([self.keys, self.unused(engines, capacity)], axis=1)
            self.versions = np.concatenate([self.versions, np.zeros_like(self.versions)], axis=1)
        self.keys[engine, index] = engine * _ROW + step
        self.versions[engine, index] = version
        self.loads[engine] = index + 1

    def split(
        self, engines: np.ndarray, starts: np.ndarray, ends: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The tokens of sequences (engine, start step, end step) by the version that wrote them: for
        each span of one version, its sequence's index, its first position, its tokens and the version."""
        return _split(
            self.keys.ravel(), self.versions.ravel(), engines * _ROW + starts, engines * _ROW + ends
        )


def _split(
    keys: np.ndarray, versions: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``_Timelines.split`` on the flattened keys (each row with an unused cell after its last load)."""
    first = np.searchsorted(keys, starts, "right") - 1  # the load in force at a sequence's first step
    spans = np.searchsorted(keys, ends, "left") - first  # ... to its last load before its end
    sequence = np.repeat(np.arange(len(starts)), spans)
    # each sequence's loads in turn, flattened: first, first + 1, ... for its spans
    load = np.arange(len(sequence)) + np.repeat(first - (np.cumsum(spans) - spans), spans)
    low = np.maximum(keys[load], starts[sequence])
    tokens = np.minimum(keys[load + 1], ends[sequence]) - low
    kept = tokens > 0  # a version replaced at the step it was loaded at wrote nothing
    return sequence[kept], (low - starts[sequence])[kept], tokens[kept], versions[load][kept]


def written_by(engine: _Engine, start: int, end: int) -> list[list[int]]:
    """[version, tokens] of the engine's decode steps ``start`` to ``end``, from its timeline of loads
    (``_split`` on one sequence: what the trainer counts, a batch at once)."""
    keys = np.array([*engine.timeline_at, _ROW - 1], dtype=np.int64)
    versions = np.array([*engine.timeline, 0], dtype=np.int64)
    _, _, tokens, version = _split(keys, versions, np.array([start]), np.array([end]))
    return [[v, t] for v, t in zip(version.tolist(), tokens.tolist(), strict=True)]


class _Simulation:
    def __init__(self, workload: Workload, costs: CostModel, seed: int) -> None:
        self.w, self.costs = workload, costs
        self.rng = np.random.default_rng(seed)
        self.step_rng = np.random.default_rng([seed, 1])
        self.now = 0.0
        self.events: list[tuple[float, int, int, int, int]] = []  # time, order, kind, engine, generation
        self.order = 0
        self.engines = [_Engine(index) for index in range(workload.engines)]
        self.timelines = _Timelines(workload.engines)
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
        # the workload's settings read at every event, once
        self.capacity, self.ahead = workload.capacity, workload.ahead
        self.group_room = max(workload.in_flight, workload.group_size) - workload.group_size  # most held
        self.conventional = workload.mode == "conventional"
        # conventional mode: the round's version, prompts not yet admitted, sequences not yet finished
        self.round_version = 0
        self.round_prompts = workload.round_size
        self.round_unfinished = self.round_prompts
        self.steps_in_round = 0  # conventional mode: steps taken on the round being trained
        self.lag_tokens: Counter[int] = Counter()
        self.bin_width = max(1, -(-int(workload.lengths.longest) // POSITION_BINS))
        # by position: the trained tokens' lags summed and the tokens, as differences (count_positions)
        self.position_lag = np.zeros((2, self.bin_width * POSITION_BINS + 1), dtype=np.int64)
        self.trained_samples = self.trained_tokens = self.multi_version = self.dropped = 0

    # ----- the event queue ----------------------------------------------------------------------------

    def schedule(self, at: float, engine: _Engine | None = None) -> None:
        """The engine's next event (void once its generation bumps), or without one the trainer's."""
        if engine is None:
            heapq.heappush(self.events, (at, self.order, _TRAINER, 0, 0))
        else:
            heapq.heappush(self.events, (at, self.order, _ENGINE, engine.index, engine.generation))
        self.order += 1

    def run(self) -> SimulatedRun:
        for engine in self.engines:
            self.schedule(0.0, engine)
        events, engines = self.events, self.engines
        while self.end is None:
            if not events:
                raise RuntimeError(f"the simulated run stalled at version {self.version}, t={self.now:.3f} s")
            self.now, _, kind, subject, generation = heapq.heappop(events)
            if kind == _ENGINE:
                if generation == engines[subject].generation:
                    self.engine_ready(engines[subject])
            else:
                self.trainer_ready()
        return self.figures()

    # ----- engines ------------------------------------------------------------------------------------

    def engine_ready(self, engine: _Engine) -> None:
        now = self.now
        if engine.waiting_since is not None:
            engine.idle_s += now - engine.waiting_since
            engine.waiting_since = None
        if engine.chunk is not None:
            self.finish_chunk(engine)
        if engine.outbox and not self.flush(engine):
            engine.waiting_since = now  # blocked: the queue is full
            return
        if engine.pending is not None and self.loads_now(engine):  # between two decode steps: load
            engine.version, engine.pending = engine.pending, None
            engine.timeline_at.append(engine.steps)
            engine.timeline.append(engine.version)
            self.timelines.load(engine.index, engine.steps, engine.version)
            pause = self.costs.update_pause_s
            if self.w.recompute:  # the cached prefixes again, under the new weights
                pause += self.costs.prefill_per_token_s * self.context(engine)
            engine.paused_s += pause
            self.schedule(now + pause, engine)
            return
        # most events end a sequence or two: with no room for a group, admit is not even asked
        admitted = 0 if engine.draining or len(engine.ends) > self.group_room else self.admit(engine)
        if admitted:
            prefill = self.costs.prefill_per_token_s * self.w.prompt_tokens * admitted * self.w.group_size
            self.schedule(now + prefill, engine)
            return
        if engine.ends:
            steps = engine.ends[0][0] - engine.steps
            in_flight = len(engine.ends)
            context = self.context(engine)
            scale = self.decode_scale()
            engine.chunk = _Chunk(now, steps, in_flight, context, scale)
            self.schedule(now + scale * self.costs.decode_steps_s(steps, in_flight, context), engine)
            return
        engine.waiting_since = now  # nothing to do until weights or a round arrive

    def context(self, engine: _Engine) -> int:
        """The tokens the engine's sequences in flight hold: their prompts and what they wrote."""
        return len(engine.ends) * (self.w.prompt_tokens + engine.steps) - engine.starts

    def loads_now(self, engine: _Engine) -> bool:
        """Whether the engine takes the weights that arrived in now: at once, except in async mode,
        where it drains first once they are ``drain_lag`` versions ahead (``ContinuousAdmission``)."""
        if engine.pending is None:
            return False
        if self.w.mode != "async":
            return True
        if engine.pending - engine.version >= self.w.drain_lag:
            engine.draining = True
        if engine.draining and not engine.ends:
            engine.draining = False
            return True
        return False

    def finish_chunk(self, engine: _Engine) -> None:
        assert engine.chunk is not None
        engine.steps += engine.chunk.steps
        engine.chunk = None
        ends, steps = engine.ends, engine.steps
        while ends and ends[0][0] == steps:
            _, _, group, start = heapq.heappop(ends)
            engine.starts -= start
            first_version = engine.timeline[bisect.bisect_right(engine.timeline_at, start) - 1]
            engine.outbox.append(_Sequence(group, engine.index, start, steps, first_version))

    def flush(self, engine: _Engine) -> bool:
        """Move the engine's finished sequences into the queue while there is room; True when all went."""
        readied = False
        outbox, queue, size = engine.outbox, self.queue, self.w.group_size
        while outbox and len(queue) < self.capacity:
            sequence = outbox.popleft()
            group = self.incomplete.setdefault(sequence.group, [])
            group.append(sequence)
            if len(group) == size:  # the group's last sample: the group is ready
                queue.extend(self.incomplete.pop(sequence.group))
                self.round_unfinished -= size
                readied = True
        if readied:
            self.trainer_try_start()
        return not outbox

    def admit(self, engine: _Engine) -> int:
        """Admit whole groups into free slots (a group larger than H alone); returns the prompts."""
        size = self.w.group_size
        groups = max(0, (max(self.w.in_flight, size) - len(engine.ends)) // size)
        if self.conventional:
            groups = min(groups, self.round_prompts // size) if engine.version == self.round_version else 0
            self.round_prompts -= groups * size
        steps = engine.steps
        for _ in range(groups):
            for length in self.w.lengths.sample(self.rng, size).tolist():
                heapq.heappush(engine.ends, (steps + int(length), self.sequences, self.groups, steps))
                self.sequences += 1
            self.groups += 1
        engine.starts += steps * groups * size
        return groups

    def update_arrives(self, version: int) -> None:
        for engine in self.engines:
            engine.pending = version
            chunk = engine.chunk
            if chunk is not None and self.w.mode != "async":  # the step under way ends, then the load
                self.cut(engine, chunk)
            elif engine.waiting_since is not None and not engine.outbox:
                engine.generation += 1
                self.schedule(self.now, engine)

    def cut(self, engine: _Engine, chunk: _Chunk) -> None:
        """End the engine's decode steps under way at the end of the step in progress (the engine then
        takes new weights in, or goes on at another pace)."""
        elapsed = (self.now - chunk.start) / chunk.scale
        done = self.costs.steps_within(elapsed, chunk.in_flight, chunk.context, chunk.steps)
        between = self.costs.decode_steps_s(done, chunk.in_flight, chunk.context) == elapsed
        steps = min(chunk.steps, done if between else done + 1)
        if steps < chunk.steps:
            chunk.steps = steps
            engine.generation += 1
            taken = self.costs.decode_steps_s(steps, chunk.in_flight, chunk.context)
            self.schedule(chunk.start + chunk.scale * taken, engine)

    def decode_scale(self) -> float:
        """The share of its measured time a decode step takes now: less while the trainer does not train,
        on cores the stages share (``CostModel.actor_alone_speedup``)."""
        return 1.0 if self.trainer == "training" else 1.0 - self.costs.actor_alone_speedup

    def trainer_changes(self) -> None:
        """The trainer starts or stops training: on shared cores each engine's steps under way end at the
        step in progress and go on at the new pace."""
        if self.costs.actor_alone_speedup:
            for engine in self.engines:
                if engine.chunk is not None:
                    self.cut(engine, engine.chunk)

    def wake_blocked(self) -> None:
        for engine in self.engines:
            if engine.outbox:
                engine.generation += 1
                self.schedule(self.now, engine)

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
            if ahead >= self.ahead:
                return
            if self.w.max_lag is not None:
                trains_at = self.version + ahead
                kept = [s for s in self.queue if trains_at - s.first_version <= self.w.max_lag]
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
        tokens = self.count_lags(batch)
        self.trained_samples += len(batch)
        self.trained_tokens += tokens
        self.trainer = "training"
        self.trainer_changes()
        alone = sum(engine.chunk is None for engine in self.engines) / len(self.engines)
        scale = 1.0 - self.costs.trainer_alone_speedup * alone
        self.schedule(self.now + scale * self.costs.train_step_s(tokens, len(batch)) * self.step_jitter())
        self.build_batches()

    def step_jitter(self) -> float:
        """This step's time as a share of ``train_step_s``: 1, or a lognormal draw of mean 1 with the
        profile's ``train_step_log_sd`` (its own generator: the lengths drawn do not move with it)."""
        sd = self.costs.train_step_log_sd
        return float(self.step_rng.lognormal(-sd * sd / 2, sd)) if sd else 1.0

    def count_lags(self, batch: list[_Sequence]) -> int:
        """Count the batch's tokens by lag and by position, and its sequences written by two or more
        versions; returns its tokens. The whole batch at once: its sequences split into spans of one
        version each (``_Timelines.split``)."""
        engines, starts, ends = np.array([(s.engine, s.start, s.end) for s in batch], dtype=np.int64).T
        sequence, first, tokens, version = self.timelines.split(engines, starts, ends)
        lag = self.version - version
        by_lag = np.bincount(lag, weights=tokens).astype(np.int64)  # exact: whole numbers below 2^53
        for each in np.flatnonzero(by_lag).tolist():
            self.lag_tokens[each] += int(by_lag[each])
        self.count_positions(first, first + tokens, lag)
        self.multi_version += int(np.count_nonzero(np.bincount(sequence) > 1))
        return int((ends - starts).sum())

    def count_positions(self, first: np.ndarray, end: np.ndarray, lag: np.ndarray) -> None:
        """Count the tokens at positions ``first`` to ``end`` (exclusive), trained at ``lag`` (a span of
        tokens each), by position, as differences: a span adds its lag and a token at its first
        position and takes them back at its end (``figures`` sums them, then by span of positions)."""
        size = max(self.position_lag.shape[1], int(end.max()) + 1)
        if size > self.position_lag.shape[1]:  # a sequence longer than the lengths' longest
            self.position_lag = np.pad(self.position_lag, ((0, 0), (0, size - self.position_lag.shape[1])))
        for row, weights in ((0, lag), (1, None)):  # the lags summed, the tokens
            difference = np.bincount(first, weights, size) - np.bincount(end, weights, size)
            self.position_lag[row] += difference.astype(np.int64)

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
            if not self.conventional or self.steps_in_round == self.w.steps_per_round:
                self.trainer = "publishing"  # the broadcast holds the trainer
                self.trainer_changes()
                self.schedule(self.now + self.costs.transfer_s)
                return
            self.trainer = "waiting"
            self.trainer_changes()
        elif self.trainer == "publishing":
            if self.conventional:  # the next round, generated with these weights
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
        # by span of positions (the last one open-ended): the lags summed, the tokens
        by_span = np.add.reduceat(
            self.position_lag.cumsum(axis=1), np.arange(POSITION_BINS) * self.bin_width, axis=1
        )
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
                for span, (lags, tokens) in enumerate(zip(*by_span, strict=True))
                if tokens
            ],
            in_flight=self.w.in_flight,
        )


def simulate(workload: Workload, costs: CostModel, seed: int = 0) -> SimulatedRun:
    """Simulate ``workload`` under ``costs`` until the trainer's ``workload.steps``-th step ends."""
    return _Simulation(workload, costs, seed).run()
