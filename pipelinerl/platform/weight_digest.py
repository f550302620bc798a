"""The digest of a weight bucket: what an actor checks before it loads any tensor of that bucket.

The weight group (``weights``) carries the tensors over a torch.distributed collective that is
neither encrypted nor authenticated: a stranger who reaches the trainer's store can join it or
inject bytes into a broadcast. The authenticated ZeroMQ notice channel carries the truth: after the
broadcast of an update, the trainer sends a ``WeightDigests`` message with one digest per bucket
(``weight_buckets``), each hashed while that bucket was being broadcast; a member hashes every bucket
as it arrives (while the next one arrives), compares once the message is in, and loads nothing of an
update with a bucket whose digest differs (``refused_buckets``).

What is hashed: the bucket's raw bytes, exactly as they cross the wire: the flattened buffer, its
members' elements end to end in tensor order, each element in the machine's (little-endian) byte
order, whatever its dtype (bfloat16 included: numpy cannot hold it, so the bytes are read through a
``torch.uint8`` view). Hashing the members one after the other gives the digest of their
concatenation, so the trainer need not build the flattened bucket to hash it.

The hash is BLAKE3 (the ``blake3`` package, which vLLM depends on too), 32 bytes. The notice is
authenticated, so a keyless hash is enough: forging a bucket means finding other bytes with the same
digest (a second preimage), which BLAKE3's 256-bit output rules out. BLAKE3 rather than SHA-256
because the digest is on the update's path: on the machine of docs/benchmarks.md SHA-256 (OpenSSL,
on the CPU's SHA instructions) hashes 1.6 GB/s a core, about as fast as gloo moves the weights, so it
doubled the update; BLAKE3 hashes 4.4 GB/s on one core and splits one large input over every core
(``max_threads=AUTO``) while the GIL is let go. Importing this module loads no torch (``wire`` reads
``DIGEST_BYTES`` here).

GPU paths (NCCL broadcast of CUDA tensors, CUDA IPC between processes sharing a GPU): not verified
here (no GPU on the machine this was written on). The bucket lives in GPU memory, and this module
hashes on the host, so each side copies every bucket to the host to hash it: a device-to-host copy
of the whole model per update on the trainer and on every member (at ~25 GB/s over PCIe 4 x16, ~40
ms a GB, plus the hashing itself at a few GB/s on the host's cores), where the
broadcast itself would never leave the GPUs. That cost can exceed the broadcast's; a GPU-side hash
(a keyless cryptographic hash as a CUDA kernel) would avoid the copy, and none is written.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from blake3 import blake3

if TYPE_CHECKING:
    import torch

ALGORITHM = "blake3"
DIGEST_BYTES = 32  # what every bucket digest is long


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of ``tensor``'s elements in row-major order, as the flattened bucket holds them.

    A tensor on a GPU is copied to the host; a non-contiguous one is copied into row-major order
    first (``reshape``), which is the order the trainer flattens it in."""
    import torch  # noqa: PLC0415 (the wire imports DIGEST_BYTES from here and must not load torch)

    flat = tensor.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    flat = flat.contiguous()
    return flat.view(torch.uint8).numpy().data


def bucket_digest(parts: Iterable[torch.Tensor]) -> bytes:
    """The digest of the bytes of ``parts`` end to end: one tensor (a received flattened bucket), or
    the members of a bucket in order (the trainer, before it flattens them): both give the same."""
    hasher = blake3(max_threads=blake3.AUTO)
    for part in parts:
        hasher.update(tensor_bytes(part))
    return hasher.digest()


def refused_buckets(received: Sequence[bytes], announced: Sequence[bytes] | None) -> tuple[list[int], str]:
    """The buckets whose ``received`` digest (a member's, one per bucket it received) differs from the
    trainer's ``announced`` one, with why; ``([], "")`` when every bucket matches. No digests
    (``None``: they never came), or digests that are not one per bucket, refuse every bucket."""
    if announced is None:
        return list(range(len(received))), "the trainer's digests of this update did not come"
    if len(announced) != len(received):
        return list(range(len(received))), f"{len(announced)} digests came for {len(received)} buckets"
    refused = [
        number
        for number, (mine, theirs) in enumerate(zip(received, announced, strict=True))
        if not hmac.compare_digest(mine, theirs)
    ]
    return refused, "its bytes differ from the digest the trainer announced" if refused else ""
