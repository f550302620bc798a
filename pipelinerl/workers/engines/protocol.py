"""The actor's inference-engine interface and the results it hands back.

An engine keeps up to H sequences in flight, returns each finished one with, for every generated
token, its behaviour log-prob (under the distribution actually sampled from) and the policy
version that produced it, and can swap its weights **between two decode steps** without dropping
in-flight sequences (paper §3). Engines: ``transformers`` (``transformers_engine.py``) and ``vllm``
(``vllm_engine.py``). ``update_weights``' ``load`` receives what holds the weights: the model itself
for transformers (``Engine[torch.nn.Module]``); for vLLM, whose model lives in its worker processes,
a handle that has the workers receive the tensors from the weight group and load them
(``WorkersEngine``, an ``Engine[EngineWorkers]``). Code that drives either engine (the actor) holds
an ``Engine[WeightHolder]`` and gives it a ``load`` that takes both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias, TypeVar

import torch


@dataclass(frozen=True)
class CompletedSequence:
    request_id: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    behaviour_logprobs: list[float]
    token_versions: list[int]
    finished: bool  # ended with EOS; False when cut at max_new_tokens


@dataclass
class VersionSwitches:
    """Which policy version wrote which token of one request.

    ``submitted_version`` wrote tokens from 0; each ``(tokens_before, version)`` switch says that
    ``version`` wrote every token from index ``tokens_before`` on. Switches are appended in
    version order, so a later switch overrides an earlier one from its index on.
    """

    submitted_version: int
    switches: list[tuple[int, int]] = field(default_factory=list)

    def versions(self, num_tokens: int) -> list[int]:
        stamped = [self.submitted_version] * num_tokens
        for tokens_before, version in self.switches:
            for index in range(min(tokens_before, num_tokens), num_tokens):
                stamped[index] = version
        return stamped


@dataclass(frozen=True)
class WorkersReceipt:
    """What an engine's workers answer for an update they received (``EngineWorkers.receive``)."""

    seconds: float  # the slowest worker's
    digests: list[list[bytes]]  # each worker's digest of every bucket it received


class EngineWorkers(Protocol):
    """What holds the weights of an engine whose model lives in other processes (vLLM's workers):
    the workers take the tensors from the weight group themselves."""

    def receive(self, names: list[str], shapes: list[list[int]], dtypes: list[str]) -> WorkersReceipt:
        """Every worker receives one update whole and hashes every bucket; nothing is staged until
        ``keep_received`` (``checked_receive``: the digests are compared with the trainer's first)."""
        ...

    def keep_received(self, keep: bool) -> None:
        """Stage the update just received (``keep``) or drop it; an earlier staged update stays then."""
        ...

    def load_received(self) -> float:
        """Load the update received and kept earlier."""
        ...


# What ``update_weights``' ``load`` may receive: the transformers model, or the vLLM workers' handle.
WeightHolder: TypeAlias = torch.nn.Module | EngineWorkers

# Covariant: an engine whose load gets the model is an engine whose load gets a WeightHolder.
HolderT_co = TypeVar("HolderT_co", covariant=True)


class Engine(Protocol[HolderT_co]):
    """H sequences in flight; weights swap between two decode steps. ``HolderT_co``: what holds the
    weights (``load``'s argument): ``torch.nn.Module`` for transformers, ``EngineWorkers`` for vLLM."""

    policy_version: int
    # The phases of the last ``update_weights``, seconds: ``pause`` (asking for the pause until the
    # engine stopped between two steps), ``load``, ``label_resume`` (stamping the versions, resuming).
    last_update_s: dict[str, float]

    def submit(self, request_id: str, prompt_token_ids: Sequence[int], greedy: bool = False) -> None: ...

    def poll(self, timeout_s: float) -> list[CompletedSequence]: ...

    @property
    def num_in_flight(self) -> int: ...

    def abort(self, request_ids: Sequence[str]) -> None:
        """Stop writing these requests; ``poll`` never returns them."""
        ...

    def update_weights(self, new_version: int, load: Callable[[HolderT_co], object]) -> float:
        """Pause between decode steps, run ``load(holder)``, stamp the switch; returns pause seconds."""
        ...

    def paused(self) -> AbstractContextManager[HolderT_co]: ...

    def close(self) -> None: ...


class WorkersEngine(Engine[EngineWorkers], Protocol):
    """An engine whose workers are the weight-group members (vLLM): they can also receive an update
    into staging buffers without loading it (the actor's async mode loads it when it drains)."""

    @property
    def workers(self) -> EngineWorkers:
        """The workers, also reached without a pause: receiving into staging that way (the actor's
        async mode) stalls generation, between two engine steps, only while the tensors arrive."""
        ...

    def rejoin_weight_group(self) -> None:
        """The workers join the weight group a restarted trainer leads."""
        ...


def iter_named_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters in a fixed order shared by trainer and actor (tied weights appear once)."""
    yield from model.named_parameters(remove_duplicate=True)
