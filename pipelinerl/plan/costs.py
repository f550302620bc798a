"""The cost model of a simulated run: how long each piece of work takes, in seconds.

* A **decode step** of an engine writes one token of every sequence it holds. Its time grows with the
  sequences in flight ``n`` (the batch's matrix work) and with the tokens they hold in all (attention
  reads every cached token):
  ``decode_step_s(n, context) = decode_base_s + decode_per_sequence_s * n + decode_per_context_token_s
  * context``; the three coefficients are fitted per engine and model, never assumed. Where the
  engine's step was measured at several H (``pipelinerl bench decode``), ``decode_table`` holds those
  (H, seconds) points and replaces ``decode_base_s + decode_per_sequence_s * n``: the step at n is read
  off the measured points (linear between two, and beyond the last along its last segment), because on
  real hardware it is not linear in n (caches, kernels chosen by batch size).
* A **prefill** of a new prompt costs ``prefill_per_token_s`` per prompt token, on the engine's time.
* A **trainer step** (one optimizer step on B sequences): ``train_base_s + train_per_token_s * tokens
  + train_per_sequence_s * sequences``, times a factor drawn for each step from a lognormal of mean 1
  and log-spread ``train_step_log_sd`` (0: none), as measured steps spread around their fit.
* A **weight update** is two costs: the **transfer** (``transfer_s``: the trainer's broadcast, which
  holds the trainer) and the engine's **pause** (``update_pause_s``: what an engine stops decoding for
  to take the weights in, between two decode steps). Below ~8B parameters the pause, not the
  transfer, is what an in-flight update costs the actors.
* **Stages sharing cores** (this 2-core machine; 0 where each stage has its own devices): the decode and
  step costs are as measured with the other stage busy; an engine's decode step takes
  ``1 - actor_alone_speedup`` of that while the trainer is not training, and a trainer step
  ``1 - trainer_alone_speedup · (the share of engines not decoding)`` of it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class CostModel:
    decode_base_s: float
    decode_per_sequence_s: float = 0.0
    decode_per_context_token_s: float = 0.0
    prefill_per_token_s: float = 0.0
    train_base_s: float = 0.0
    train_per_token_s: float = 0.0
    train_per_sequence_s: float = 0.0
    transfer_s: float = 0.0
    update_pause_s: float = 0.0
    actor_alone_speedup: float = 0.0
    trainer_alone_speedup: float = 0.0
    # The spread of the trainer's step times around train_step_s: the standard deviation of their log
    # (0: every step takes what train_step_s says; the simulator draws each step's factor from a
    # lognormal of mean 1 with this spread, so a slow step's backlog shows in the lag)
    train_step_log_sd: float = 0.0
    # (H, seconds of a decode step of H sequences), H ascending: replaces base + per-sequence when given
    decode_table: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        check_decode_table(self.decode_table)
        for field in fields(self):
            if field.name == "decode_table":
                continue
            value = getattr(self, field.name)
            if not value >= 0.0:  # also refuses NaN
                raise ValueError(f"{field.name}={value!r}: a cost is a number of seconds, 0 or more")
        for name in ("actor_alone_speedup", "trainer_alone_speedup"):
            if getattr(self, name) >= 1.0:
                raise ValueError(f"{name}={getattr(self, name)!r}: a share of the time saved, below 1")
        if not self.decode_table and self.decode_base_s + self.decode_per_sequence_s <= 0.0:
            raise ValueError(
                "decode_base_s + decode_per_sequence_s must be above 0: a decode step of one sequence "
                "that takes no time would write any length at once"
            )

    def decode_step_s(self, in_flight: int, context_tokens: int) -> float:
        """One decode step of an engine holding ``in_flight`` sequences of ``context_tokens`` in all."""
        if self.decode_table:
            by_sequences = read_table(self.decode_table, in_flight)
        else:
            by_sequences = self.decode_base_s + self.decode_per_sequence_s * in_flight
        return by_sequences + self.decode_per_context_token_s * context_tokens

    def decode_steps_s(self, steps: int, in_flight: int, context_tokens: int) -> float:
        """``steps`` decode steps in a row, no sequence joining or leaving: each adds ``in_flight``
        tokens to the context, so the time is the sum of an arithmetic series."""
        if steps <= 0:
            return 0.0
        growth = self.decode_per_context_token_s * in_flight * steps * (steps - 1) / 2
        return steps * self.decode_step_s(in_flight, context_tokens) + growth

    def steps_within(self, seconds: float, in_flight: int, context_tokens: int, at_most: int) -> int:
        """The most decode steps (up to ``at_most``) that end within ``seconds``."""
        low, high = 0, at_most  # decode_steps_s is increasing in steps: bisect
        while low < high:
            middle = (low + high + 1) // 2
            if self.decode_steps_s(middle, in_flight, context_tokens) <= seconds:
                low = middle
            else:
                high = middle - 1
        return low

    def train_step_s(self, tokens: int, sequences: int) -> float:
        return self.train_base_s + self.train_per_token_s * tokens + self.train_per_sequence_s * sequences


def check_decode_table(points: tuple[tuple[float, float], ...]) -> None:
    """A decode table is empty, or 2 or more points of distinct H (1 or more, ascending) and a step time
    above 0 each; ``ValueError`` naming the point otherwise."""
    if not points:
        return
    if len(points) < 2:
        raise ValueError(f"decode_table={list(points)}: 2 or more points (H, seconds), or none")
    for index, (in_flight, seconds) in enumerate(points):
        if in_flight < 1 or not seconds > 0.0:
            raise ValueError(
                f"decode_table point {index} ({in_flight}, {seconds}): H 1 or more, seconds above 0"
            )
        if index and in_flight <= points[index - 1][0]:
            raise ValueError(f"decode_table point {index} (H={in_flight}): H must ascend")


def read_table(points: tuple[tuple[float, float], ...], in_flight: float) -> float:
    """The step time at ``in_flight`` from the measured points: linear between the two around it; below
    the first, along the first segment, never under the first point's time scaled down by H (a smaller
    batch is not cheaper per sequence); beyond the last, along the last segment, never falling."""
    index = bisect.bisect_left(points, in_flight, key=lambda point: point[0])  # no copy: a hot path
    if index < len(points) and points[index][0] == in_flight:
        return points[index][1]
    segment = min(max(index, 1), len(points) - 1)  # the points on either side, or the nearest two
    (h0, s0), (h1, s1) = points[segment - 1], points[segment]
    slope = (s1 - s0) / (h1 - h0)
    if index == 0:
        return max(s0 + slope * (in_flight - h0), s0 * in_flight / h0)
    if index == len(points):
        return s1 + max(slope, 0.0) * (in_flight - h1)
    return s0 + slope * (in_flight - h0)
