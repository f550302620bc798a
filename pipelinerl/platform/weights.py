"""The weight group: trainer rank 0 and every actor in one torch.distributed process group.

A weight update is a ``WeightUpdate`` notice over ZeroMQ PUB/SUB (the new policy version and the
parameter list) followed by one broadcast per tensor from trainer rank 0 (group rank 0) to the
actors (group ranks 1..N). The group is built directly from a ``TCPStore`` rather than through
``init_process_group``, because the trainer's default group already belongs to DeepSpeed.

Backend: gloo on CPU; on GPUs the same shape uses NCCL.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

TRAINER_RANK = 0
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class WeightGroup:
    """One member of the weight group. Rank 0 (the trainer) hosts the rendezvous store."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float = 300.0) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"weight-group rank {rank} is outside 0..{world_size - 1}")
        self.rank = rank
        self.world_size = world_size
        timeout = timedelta(seconds=timeout_s)
        self._store = dist.TCPStore(
            host, port, world_size, is_master=rank == TRAINER_RANK, timeout=timeout, wait_for_workers=False
        )
        self._group = dist.ProcessGroupGloo(
            dist.PrefixStore("weights", self._store), rank, world_size, timeout
        )

    def broadcast(self, tensors: Iterable[torch.Tensor]) -> float:
        """Send (rank 0) or receive (others) each tensor in order, in place; returns seconds taken."""
        started = time.perf_counter()
        for tensor in tensors:
            buffer = tensor if tensor.is_contiguous() else tensor.contiguous()
            self._group.broadcast(buffer, TRAINER_RANK).wait()  # type: ignore[attr-defined]
            if buffer is not tensor:
                tensor.copy_(buffer)
        return time.perf_counter() - started


def receive_buffers(shapes: list[list[int]], dtypes: list[str]) -> list[torch.Tensor]:
    """Empty tensors to receive a broadcast into, from a notice's shapes and dtype names."""
    for dtype in dtypes:
        if dtype not in DTYPES:
            raise ValueError(f"weight dtype {dtype!r} is not one of {sorted(DTYPES)}")
    return [torch.empty(shape, dtype=DTYPES[dtype]) for shape, dtype in zip(shapes, dtypes, strict=True)]


def saved_tensor_shapes(model_dir: Path) -> dict[str, list[int]]:
    """Name -> shape of every tensor in the model directory's safetensors files, read from their
    headers only (empty when the directory has none, e.g. a ``pytorch_model.bin`` model)."""
    shapes: dict[str, list[int]] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with path.open("rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(size))
        shapes.update(
            {name: list(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}
        )
    return shapes


def weight_update_problem(
    names: list[str],
    shapes: list[list[int]],
    dtypes: list[str],
    *,
    saved_shapes: Mapping[str, list[int]],
) -> str | None:
    """Why an actor must not receive this update into its model, or None: a dtype outside ``DTYPES``,
    or, where the model's tensors are known (``saved_shapes``), a name the model does not have or a
    shape other than its own. Checked before anything is allocated, so a corrupt notice cannot make
    the actor allocate what it announces. (The dtype may differ from the actor's own: a bf16 trainer
    on a GPU feeds a float32 actor on CPU; loading converts.)"""
    for name, shape, dtype in zip(names, shapes, dtypes, strict=True):
        if dtype not in DTYPES:
            return f"parameter {name!r} comes as {dtype!r}, not one of {sorted(DTYPES)}"
        if not saved_shapes:
            continue
        if name not in saved_shapes:
            return f"parameter {name!r} is not one of the model's {len(saved_shapes)} tensors"
        if list(shape) != list(saved_shapes[name]):
            return f"parameter {name!r} comes with shape {list(shape)}; the model's is {saved_shapes[name]}"
    return None


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
    return str(tensor.dtype).removeprefix("torch.")
