"""What a simulated run asks of the cluster (``Workload``): its mode, engines, H, B, G, steps, lengths.

The modes are the platform's (``workers/admission.py``):

* ``pipeline``: every engine keeps H sequences in flight and loads each update between two decode
  steps, the sequences it holds going on under the new weights (``recompute``: their cached prefixes
  are recomputed under them, a prefill of every token in flight);
* ``async``: the same admission, but an update waits until the engine is ``drain_lag`` versions behind;
  the engine then admits nothing until its sequences have finished (a drain), loads, and admits again;
* ``conventional``: rounds of B·G sequences generated with one version, then G steps on them (with
  ``train_during_round``, the first steps start while the round is still generated).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipelinerl.plan.lengths import Lengths

SimulatedMode = Literal["pipeline", "conventional", "async"]
SIMULATED_MODES: tuple[SimulatedMode, ...] = ("pipeline", "conventional", "async")


@dataclass(frozen=True)
class Workload:
    """What a run asks of the cluster: its mode, engines, H, B, G and the sequences it writes."""

    mode: SimulatedMode
    engines: int
    in_flight: int  # H: sequences per engine
    batch_size: int  # B: sequences per optimizer step
    steps: int  # optimizer steps to simulate
    prompt_tokens: int
    lengths: Lengths
    steps_per_round: int = 1  # G, conventional mode
    group_size: int = 1  # samples per prompt, admitted together and trained together
    train_during_round: bool = False
    max_lag: int | None = None
    # Sequences waiting for the trainer. None: two batches (pipeline), a round and a batch (conventional).
    queue_capacity: int | None = None
    batches_ahead: int = 2  # transport.batches_ahead: batches built or training at once
    drain_lag: int = 1  # async mode: versions behind at which an engine drains to load (run.async_drain_lag)
    recompute: bool = False  # pipeline mode: an update recomputes the cache of the sequences in flight

    def __post_init__(self) -> None:
        if self.mode not in SIMULATED_MODES:
            raise ValueError(f"mode={self.mode!r}: the simulator models {', '.join(SIMULATED_MODES)}")
        for name in (
            "engines",
            "in_flight",
            "batch_size",
            "steps",
            "steps_per_round",
            "group_size",
            "batches_ahead",
            "drain_lag",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: at least 1")
        if self.batch_size % self.group_size:
            raise ValueError(
                f"batch_size={self.batch_size}: a multiple of group_size={self.group_size} (whole groups)"
            )
        if self.mode != "conventional" and self.group_size > self.in_flight:
            raise ValueError(
                f"group_size={self.group_size} above in_flight={self.in_flight}: in {self.mode} mode "
                "whole groups are admitted up to H, so none ever would be; make H at least the group"
            )
        if self.prompt_tokens < 0:
            raise ValueError(f"prompt_tokens={self.prompt_tokens}: 0 or more")
        if self.max_lag is not None and self.max_lag < 0:
            raise ValueError(f"max_lag={self.max_lag}: 0 or more, or None for no bound")
        round_lag = self.steps_per_round - 1
        if self.mode == "conventional" and self.max_lag is not None and self.max_lag < round_lag:
            raise ValueError(
                f"max_lag={self.max_lag} below steps_per_round - 1 = {round_lag} in conventional mode: "
                "dropping part of a round is not modelled"
            )
        if self.recompute and self.mode != "pipeline":
            raise ValueError(
                f"recompute with mode={self.mode!r}: only pipeline mode updates the weights under "
                "sequences in flight"
            )
        least = self.round_size if self.waits_for_round else self.batch_size
        if self.queue_capacity is not None and self.queue_capacity < least:
            raise ValueError(
                f"queue_capacity={self.queue_capacity}: at least {least} (a "
                f"{'whole round, which the trainer waits for' if self.waits_for_round else 'batch'}), "
                "or the trainer could never start"
            )

    @property
    def round_size(self) -> int:
        return self.batch_size * self.steps_per_round

    @property
    def waits_for_round(self) -> bool:
        return self.mode == "conventional" and not self.train_during_round

    @property
    def ahead(self) -> int:
        """Batches built or training at once (conventional mode adds the round's G - 1)."""
        return self.batches_ahead + (self.steps_per_round - 1 if self.mode == "conventional" else 0)

    @property
    def capacity(self) -> int:
        if self.queue_capacity is not None:
            return self.queue_capacity
        return self.round_size + self.batch_size if self.mode == "conventional" else 2 * self.batch_size
