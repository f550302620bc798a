"""``model.lm_head_fp32``: the LM head in float32 when the model's weights are in a lower precision.

The behaviour log-prob (actor) and the trainer's log-prob of the same token under the same weights
should be equal; with bf16 weights the head's matmul over a large vocabulary is where they drift
apart most (``rl/behaviour_mismatch`` measures it). With this option both sides compute the head
the same way: hidden states and head weight upcast to float32, float32 logits.

* trainer and transformers engine: ``float32_lm_head(model)`` below, on the loaded model;
* vllm engine: vLLM's own switch for it, ``hf_overrides={"head_dtype": "float32"}``
  (``vllm_engine.py``), which computes ``F.linear(h.float(), W.float())`` on CPU and a bf16 matmul
  with float32 output on CUDA.

The weights stay in their precision (the parameter is not copied or retyped, so a tied embedding
stays tied and the optimizer sees the same parameter); only the head's computation changes. Every
engine loads float32 weights today, where this changes nothing.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn


def _float32_forward(self: nn.Linear, hidden_states: torch.Tensor) -> torch.Tensor:
    bias = self.bias.float() if self.bias is not None else None
    return F.linear(hidden_states.float(), self.weight.float(), bias)


def float32_lm_head(model: nn.Module) -> bool:
    """Make ``model``'s output projection compute in float32; True if it changed anything.

    Only this model instance changes (its head's ``forward``). A head whose weight is already
    float32 is left alone (False).

    Raises:
        ValueError: the model has no ``nn.Linear`` output projection (``get_output_embeddings``).
    """
    output_embeddings = getattr(model, "get_output_embeddings", None)
    head = output_embeddings() if output_embeddings is not None else None
    if not isinstance(head, nn.Linear):
        raise ValueError(
            f"model.lm_head_fp32 needs a model whose output embeddings are an nn.Linear, got "
            f"{type(head).__name__} from {type(model).__name__}"
        )
    if head.weight.dtype == torch.float32:
        return False
    head.forward = types.MethodType(_float32_forward, head)  # type: ignore[method-assign]
    return True
