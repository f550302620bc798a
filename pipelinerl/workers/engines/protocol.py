"""The actor's inference-engine interface and the results it hands back.

An engine keeps up to H sequences in flight, returns each finished one with, for every generated
token, its behaviour log-prob (under the distribution actually sampled from) and the policy
version that produced it, and can swap its weights **between two decode steps** without dropping
in-flight sequences (paper §3). Engines: ``transformers`` (``transformers_engine.py``) and ``vllm``
(``vllm_engine.py``). ``update_weights``' ``load`` receives what holds the weights: the model itself
for transformers; for vLLM, whose model lives in its worker processes, a handle that has the workers
receive the tensors from the weight group and load them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

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


class Engine(Protocol):
    policy_version: int

    def submit(self, request_id: str, prompt_token_ids: Sequence[int], greedy: bool = False) -> None: ...

    def poll(self, timeout_s: float) -> list[CompletedSequence]: ...

    @property
    def num_in_flight(self) -> int: ...

    def update_weights(self, new_version: int, load: Callable[[torch.nn.Module], None]) -> float:
        """Pause between decode steps, run ``load(model)``, stamp the switch; returns pause seconds."""
        ...

    def paused(self) -> AbstractContextManager[torch.nn.Module]: ...

    def close(self) -> None: ...


def iter_named_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters in a fixed order shared by trainer and actor (tied weights appear once)."""
    yield from model.named_parameters(remove_duplicate=True)
