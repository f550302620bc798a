"""The newest weights an actor has received and not yet loaded, and how they load into an engine.

Its own module so that the engine benchmark (``bench/engine_measure.py``) loads weights with the
actor's own loader without importing the actor.
"""

from __future__ import annotations

import threading

import torch

from pipelinerl.workers.engines.protocol import WeightHolder


class StagedWeights:
    """The newest weights received, waiting to be loaded into the engine.

    ``lock`` guards every field and is held across a load (``Engine.update_weights``), so a newer
    update is never staged in the middle of loading the previous one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version = -1
        self.names: list[str] = []
        self.tensors: list[torch.Tensor] = []
        self.in_engine = False  # vllm: the engine's workers hold the staged tensors

    def load_into(self, target: WeightHolder) -> None:
        """``target``: the transformers model (the tensors staged here are copied into it), or the
        vLLM engine's workers (they load the tensors they staged themselves)."""
        if isinstance(target, torch.nn.Module):
            if self.in_engine:
                raise TypeError("the staged weights are in the engine's workers, not here: nothing to copy")
            parameters = dict(target.named_parameters())
            for name, tensor in zip(self.names, self.tensors, strict=True):
                parameters[name].data.copy_(tensor)
            return
        if not self.in_engine:
            raise TypeError("the engine's workers hold no staged weights: these are in this process")
        target.load_received()
