"""The policy's tensor types by name: what the weight group, CUDA IPC and every stage agree on.

A dtype crosses process boundaries as its name (``"bfloat16"``), never as a torch object, so the
weight group's buckets, the CUDA IPC handles and ``model.dtype`` share this one table.
"""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def policy_dtype_name(setting: str, cuda: bool | None = None) -> str:
    """``model.dtype`` resolved for a stage: ``auto`` is bfloat16 where the stage has a CUDA GPU
    (``cuda``; default: whether this process sees one) and float32 on CPU, where bf16 is slower."""
    if setting == "auto":
        on_gpu = torch.cuda.is_available() if cuda is None else cuda
        return "bfloat16" if on_gpu else "float32"
    if setting not in ("float32", "bfloat16"):
        raise ValueError(f"model.dtype {setting!r} is not one of auto, float32, bfloat16")
    return setting


def policy_dtype(setting: str, cuda: bool | None = None) -> torch.dtype:
    """``policy_dtype_name`` as a torch dtype."""
    return DTYPES[policy_dtype_name(setting, cuda)]


def dtype_name(tensor: torch.Tensor) -> str:
    """A tensor's dtype as the name in ``DTYPES`` (``torch.bfloat16`` -> ``"bfloat16"``)."""
    return str(tensor.dtype).removeprefix("torch.")
