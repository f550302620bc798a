"""CUDA IPC handles of weight buckets, for a trainer and an actor that share one GPU (``cluster.colocate``).

The trainer exports a bucket's CUDA memory as a handle; the actor's vLLM worker, another process on the
same GPU, opens it, copies the bucket and lets go, all without leaving the device. The handle is what
torch's own ``reduce_tensor`` produces for a CUDA tensor (the arguments of ``rebuild_cuda_tensor``),
written as a typed msgpack record rather than a pickle, so that opening one runs no code from the wire.

``CudaHandle.from_reduced`` / ``to_rebuild_args`` are pure and tested on CPU; ``export`` and ``open_exported``
need CUDA and have not run on a GPU here.
"""

from __future__ import annotations

from typing import Any

import msgspec
import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from pipelinerl.platform.dtypes import DTYPES


class CudaHandle(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One CUDA tensor shared with another process: ``rebuild_cuda_tensor``'s arguments, typed."""

    size: list[int]
    stride: list[int]
    tensor_offset: int
    dtype: str
    device: int
    storage_handle: bytes
    storage_size_bytes: int
    storage_offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes | None
    event_sync_required: bool

    @classmethod
    def from_reduced(cls, args: tuple[Any, ...]) -> CudaHandle:
        """From the argument tuple of ``torch.multiprocessing.reductions.reduce_tensor`` on a CUDA tensor."""
        (_, size, stride, offset, _, dtype, device, handle, storage_size, storage_offset) = args[:10]
        (_, ref_counter, ref_offset, event, event_sync) = args[10:]
        name = str(dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise ValueError(f"a weight bucket of dtype {name!r}: not one of {sorted(DTYPES)}")
        return cls(
            size=list(size),
            stride=list(stride),
            tensor_offset=int(offset),
            dtype=name,
            device=int(device),
            storage_handle=bytes(handle),
            storage_size_bytes=int(storage_size),
            storage_offset_bytes=int(storage_offset),
            ref_counter_handle=bytes(ref_counter),
            ref_counter_offset=int(ref_offset),
            event_handle=None if event is None else bytes(event),
            event_sync_required=bool(event_sync),
        )

    def to_rebuild_args(self) -> tuple[Any, ...]:
        """``rebuild_cuda_tensor``'s arguments (a plain tensor, never a parameter; no gradient)."""
        if self.dtype not in DTYPES:
            raise ValueError(f"a weight bucket of dtype {self.dtype!r}: not one of {sorted(DTYPES)}")
        return (
            torch.Tensor,
            torch.Size(self.size),
            tuple(self.stride),
            self.tensor_offset,
            torch.storage.TypedStorage,
            DTYPES[self.dtype],
            self.device,
            self.storage_handle,
            self.storage_size_bytes,
            self.storage_offset_bytes,
            False,
            self.ref_counter_handle,
            self.ref_counter_offset,
            self.event_handle,
            self.event_sync_required,
        )

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, payload: bytes) -> CudaHandle:
        return msgspec.msgpack.decode(payload, type=cls)


def export(tensor: torch.Tensor) -> bytes:
    """A handle to ``tensor``'s CUDA memory for another process on the same GPU (CUDA only). The
    tensor must stay alive, unchanged, until that process has copied it."""
    if not tensor.is_cuda:
        raise ValueError(f"CUDA IPC shares CUDA memory; this tensor is on {tensor.device}")
    _, args = reduce_tensor(tensor)
    return CudaHandle.from_reduced(args).encode()


def open_exported(payload: bytes) -> torch.Tensor:
    """The tensor another process exported (CUDA only): a view of its memory, valid until it frees it."""
    return rebuild_cuda_tensor(*CudaHandle.decode(payload).to_rebuild_args())
