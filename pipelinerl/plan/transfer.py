"""The weight transfer after an optimizer step, from its bytes, the bucket size and the link.

An update travels as buckets of at most ``transport.weight_bucket_mib`` (``platform/weight_buckets``),
one broadcast each, so its time is::

    transfer_s = fixed_s + buckets * per_bucket_s + update_bytes / bytes_per_s

* ``bytes_per_s``: what the link carries (gloo through host memory, NCCL over NVLink or InfiniBand);
* ``per_bucket_s``: each broadcast's round trip and the copies into and out of its bucket;
* ``fixed_s``: the notice that announces the update and the hand-over at either end;
* ``buckets``: the update's bytes over the bucket size, rounded up (a model's tensors are far smaller
  than buckets of tens of MiB, so the bytes decide; one tensor a bucket below that is approximated).

``pipelinerl bench weights`` measures one model's update at several bucket sizes: ``fit_link`` reads the
link's bandwidth and per-bucket cost off it (``plan calibrate --weights-record``), and a profile's
``transfer`` section carries them, so ``pipelinerl plan`` predicts the transfer for the config's own
bucket size and the profile's model instead of one fixed figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipelinerl.plan.fitting import nonnegative_fit

MIB = 2**20


@dataclass(frozen=True)
class LinkCosts:
    bytes_per_s: float
    per_bucket_s: float = 0.0
    fixed_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.bytes_per_s > 0.0:
            raise ValueError(f"bytes_per_s={self.bytes_per_s!r}: a link carries more than 0 bytes a second")
        for name in ("per_bucket_s", "fixed_s"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"{name}={getattr(self, name)!r}: a cost is a number of seconds, 0 or more")

    def seconds(self, update_bytes: int, bucket_bytes: int) -> float:
        """One update of ``update_bytes`` in buckets of at most ``bucket_bytes``."""
        return (
            self.fixed_s
            + buckets_of(update_bytes, bucket_bytes) * self.per_bucket_s
            + update_bytes / self.bytes_per_s
        )


def buckets_of(update_bytes: int, bucket_bytes: int) -> int:
    if update_bytes < 0 or bucket_bytes < 1:
        raise ValueError(f"update of {update_bytes} bytes in buckets of {bucket_bytes}: 0 or more, 1 or more")
    return max(1, math.ceil(update_bytes / bucket_bytes)) if update_bytes else 0


@dataclass(frozen=True)
class MeasuredUpdate:
    """One bucket size of a ``bench weights`` record: the update's bytes, its buckets, its median time."""

    update_bytes: int
    buckets: int
    seconds: float


def fit_link(updates: Sequence[MeasuredUpdate]) -> LinkCosts:
    """The link's costs from updates measured at several bucket sizes: least squares of the time on
    the bytes (``1 / bytes_per_s``) and the buckets (``per_bucket_s``), no coefficient below 0, and a
    fixed cost where the updates differ in their bytes. One model's bytes cannot be told from a fixed
    cost: then ``fixed_s`` is 0 and the bytes take it (the upper bound of what they cost)."""
    if len(updates) < 2:
        raise ValueError(f"{len(updates)} measured update(s): fitting a link needs 2 or more bucket sizes")
    seconds = [u.seconds for u in updates]
    sizes = [float(u.update_bytes) for u in updates]
    columns = [sizes, [float(u.buckets) for u in updates]]
    several_sizes = len(set(sizes)) > 1
    if several_sizes:
        columns.append([1.0] * len(updates))
    per_byte, per_bucket, *fixed = nonnegative_fit(columns, seconds)
    if per_byte <= 0.0:  # the fit put everything elsewhere: the bytes at the mean rate, nothing else
        return LinkCosts(bytes_per_s=float(np.mean([b / s for b, s in zip(sizes, seconds, strict=True)])))
    return LinkCosts(bytes_per_s=1.0 / per_byte, per_bucket_s=per_bucket, fixed_s=fixed[0] if fixed else 0.0)
