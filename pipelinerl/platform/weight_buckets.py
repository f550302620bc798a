"""Buckets of a weight update: which tensors travel together in one broadcast.

One broadcast per tensor costs a round trip per tensor (hundreds for a real model); one broadcast of
the whole model needs a second copy of it on both sides. A bucket is a run of consecutive tensors of
one dtype, flattened into one buffer of at most ``bucket_bytes`` (a tensor larger than that travels
alone), so each side holds at most one bucket beside the model. Both sides compute the same plan from
the update's shapes and dtypes and the group's bucket size. Pure: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

# Bytes per element of every dtype a weight update may carry (``weights.DTYPES``).
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Bucket:
    """One broadcast: the update's tensors ``members`` (indices, in order), flattened end to end."""

    dtype: str
    members: tuple[int, ...]
    offsets: tuple[int, ...]  # element offset of each member in the flat buffer
    sizes: tuple[int, ...]  # elements of each member

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


def plan_buckets(shapes: Sequence[Sequence[int]], dtypes: Sequence[str], bucket_bytes: int) -> list[Bucket]:
    """The buckets of an update, in tensor order; every tensor is in exactly one."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be at least 1, got {bucket_bytes}")
    if len(shapes) != len(dtypes):
        raise ValueError(f"{len(shapes)} shapes but {len(dtypes)} dtypes; they must be equal")
    buckets: list[Bucket] = []
    members: list[int] = []
    sizes: list[int] = []
    current = ""

    def close() -> None:
        if members:
            offsets = tuple(accumulate(sizes[:-1], initial=0))
            buckets.append(Bucket(current, tuple(members), offsets, tuple(sizes)))
            members.clear()
            sizes.clear()

    for index, (shape, dtype) in enumerate(zip(shapes, dtypes, strict=True)):
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"weight dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
        if any(dim < 0 for dim in shape):
            raise ValueError(f"tensor {index} has a negative dimension: {list(shape)}")
        size = math.prod(shape)
        held = sum(sizes) * DTYPE_BYTES[current] if members else 0
        if members and (dtype != current or held + size * DTYPE_BYTES[dtype] > bucket_bytes):
            close()
        current = dtype
        members.append(index)
        sizes.append(size)
    close()
    return buckets
