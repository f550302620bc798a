"""The weight group: trainer rank 0 and every actor in one torch.distributed process group.

A weight update is a ``WeightUpdate`` notice over ZeroMQ PUB/SUB (the new policy version and the
parameter list) followed by the tensors, broadcast from trainer rank 0 (group rank 0) to the actors
(group ranks 1..N) in buckets (``weight_buckets``): consecutive tensors flattened into one buffer of at
most the group's bucket size, so neither side holds a second copy of the model. The group is built
directly from a ``TCPStore`` rather than through ``init_process_group``, because the trainer's default
group already belongs to DeepSpeed. The store and gloo's sockets listen on ``transport.host`` only
(``stores``).

Rank 0 sets the group's terms (backend and bucket size) and publishes them in the store; every member
reads them there when it joins, so both sides are built the same way from one decision. Backends:
gloo (CPU buffers; a GPU member copies each bucket to its device), NCCL (buffers on the GPUs) and,
for a trainer and an actor sharing one GPU, CUDA IPC (each bucket's handle through the store, a gloo
barrier once every member has copied it; ``cuda_ipc``).

The collective is neither encrypted nor authenticated, so the trainer hashes every bucket while it
broadcasts it (``send`` returns the digests) and sends the digests after the broadcast over the
authenticated ZeroMQ channel (``WeightDigests``); a member hashes every bucket while the next one
arrives (``receive_update``) and uses none of the update unless every digest matches
(``ReceivedUpdate.check``, else ``BucketsRefused``). Every member takes part in every broadcast of
the update whatever its bytes, so the trainer's broadcast always completes.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist

from pipelinerl.platform.cuda_ipc import export, open_exported
from pipelinerl.platform.dtypes import DTYPES, dtype_name
from pipelinerl.platform.stores import gloo_device, host_store
from pipelinerl.platform.weight_buckets import Bucket, plan_buckets
from pipelinerl.platform.weight_digest import bucket_digest, refused_buckets

TRAINER_RANK = 0
Backend = Literal["gloo", "nccl", "ipc"]
BACKENDS: tuple[Backend, ...] = ("gloo", "nccl", "ipc")
MIB = 1 << 20
TERMS_KEY = "weights/terms"
# Buckets the trainer may broadcast ahead of their hashes: where hashing is slower than the wire (a GPU
# bucket is copied to the host to be hashed), at most this many flattened buckets wait for it.
HASHES_AHEAD = 2


class BucketsRefused(ValueError):
    """An update whose ``buckets`` (indices in the bucket plan) did not match the trainer's digests
    (``ReceivedUpdate.check``): every broadcast of the update has completed, so nothing hangs."""

    def __init__(self, buckets: list[int], reason: str) -> None:
        super().__init__(f"bucket(s) {buckets} refused: {reason}")
        self.buckets = buckets
        self.reason = reason


@dataclass(frozen=True)
class GroupTerms:
    """What rank 0 decides for the whole group."""

    backend: Backend
    bucket_bytes: int

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"weight-group backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.bucket_bytes < 1:
            raise ValueError(f"weight-group bucket size must be at least 1 byte, got {self.bucket_bytes}")


def weight_backend(setting: str, trainer_device: str, actor_engine: str, colocate: bool = False) -> Backend:
    """``transport.weight_backend`` resolved on trainer rank 0. ``auto``: CUDA IPC where the trainer and
    its one vLLM actor share a GPU (``cluster.colocate``), NCCL where a trainer on a GPU feeds vLLM
    actors on GPUs of their own, gloo otherwise."""
    if setting not in ("auto", *BACKENDS):
        raise ValueError(f"transport.weight_backend {setting!r} is not one of auto, {', '.join(BACKENDS)}")
    on_gpus = trainer_device == "cuda" and actor_engine == "vllm"
    if setting == "auto":
        return ("ipc" if colocate else "nccl") if on_gpus else "gloo"
    if setting in ("nccl", "ipc") and not on_gpus:
        raise ValueError(
            f"transport.weight_backend={setting!r} needs the trainer on a GPU and vLLM actors "
            f"(trainer.device resolved to {trainer_device!r}, actor.engine={actor_engine!r}); use 'gloo' or "
            "'auto'"
        )
    if setting == "nccl" and colocate:
        raise ValueError(
            "transport.weight_backend='nccl' cannot join two processes on one GPU (cluster.colocate=true); "
            "use 'ipc' or 'auto'"
        )
    if setting == "ipc" and not colocate:
        raise ValueError("transport.weight_backend='ipc' needs cluster.colocate=true (one shared GPU)")
    return setting  # type: ignore[return-value]


class WeightGroup:
    """One member of the weight group. Rank 0 (the trainer, ``lead``) hosts the rendezvous store and
    sets the terms; the others ``join``."""

    def __init__(
        self,
        store: dist.TCPStore,
        rank: int,
        world_size: int,
        terms: GroupTerms,
        timeout: timedelta,
        device: torch.device,
        host: str = "127.0.0.1",
    ) -> None:
        if terms.backend in ("nccl", "ipc") and device.type != "cuda":
            raise ValueError(
                f"the trainer chose {terms.backend} for the weight group (transport.weight_backend), but "
                f"group rank {rank} is on {device.type!r}, not a CUDA GPU; set "
                "transport.weight_backend='gloo'"
            )
        self.rank = rank
        self.world_size = world_size
        self.terms = terms
        self.device = device
        self._store = store  # the group's rendezvous lives as long as the group
        prefixed = dist.PrefixStore("weights", store)
        self._group: dist.ProcessGroupGloo | dist.ProcessGroupNCCL
        if terms.backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self._group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
        else:  # gloo carries the buckets, or (ipc) only the barrier after each handed-over bucket
            options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
            options._devices = [gloo_device(host)]  # its sockets on the run's host, where this machine has it
            options._timeout = timeout
            self._group = dist.ProcessGroupGloo(prefixed, rank, world_size, options)
        self._updates = 0  # updates sent or received so far: names the ipc handles in the store
        self.last_verify_s = 0.0  # seconds the last ``receive_update`` waited for its hashes
        self.last_hash_wait_s = 0.0  # seconds the last ``send`` waited for its hashes

    @classmethod
    def lead(
        cls,
        host: str,
        port: int,
        world_size: int,
        *,
        backend: Backend = "gloo",
        bucket_bytes: int = 32 * MIB,
        timeout_s: float = 300.0,
        device: torch.device | str = "cpu",
    ) -> WeightGroup:
        """Rank 0: host the store, publish the terms, form the group (returns once every member joined,
        with gloo; NCCL connects at the first broadcast)."""
        terms = GroupTerms(backend, bucket_bytes)
        timeout = timedelta(seconds=timeout_s)
        store = _store(host, port, world_size, TRAINER_RANK, timeout)
        store.set(TERMS_KEY, json.dumps({"backend": terms.backend, "bucket_bytes": terms.bucket_bytes}))
        return cls(store, TRAINER_RANK, world_size, terms, timeout, torch.device(device), host)

    @classmethod
    def join(
        cls,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        *,
        timeout_s: float = 300.0,
        device: torch.device | str = "cpu",
    ) -> WeightGroup:
        """A member (rank 1..N): read rank 0's terms from its store and form the group on them."""
        if rank == TRAINER_RANK:
            raise ValueError("weight-group rank 0 is the trainer's: members join as ranks 1 and up")
        timeout = timedelta(seconds=timeout_s)
        store = _store(host, port, world_size, rank, timeout)
        published = json.loads(store.get(TERMS_KEY))
        terms = GroupTerms(published["backend"], int(published["bucket_bytes"]))
        return cls(store, rank, world_size, terms, timeout, torch.device(device), host)

    def plan(self, tensors: Sequence[torch.Tensor]) -> list[Bucket]:
        """The buckets ``send`` broadcasts ``tensors`` in, on this group's bucket size."""
        return plan_buckets(
            [list(t.shape) for t in tensors], [dtype_name(t) for t in tensors], self.terms.bucket_bytes
        )

    def send(self, tensors: Sequence[torch.Tensor], *, hashed: bool = True) -> list[bytes]:
        """Rank 0: broadcast every tensor, bucket by bucket; returns the digest of every bucket, for the
        ``WeightDigests`` message that follows the broadcast over the authenticated channel (none
        when not ``hashed``: benchmarks and tests of the transfer alone).

        Bucket k is hashed on a thread of its own while it is broadcast (both only read it), so the
        hash costs the update only where it outlasts the transfer: the last bucket's, mostly
        (``last_hash_wait_s``: the time spent waiting for hashes after the last broadcast).
        """
        if self.rank != TRAINER_RANK:
            raise RuntimeError(f"weight-group rank {self.rank} receives; only rank 0 sends")
        hashes: list[Future[bytes]] = []
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bucket-hash") as hasher:
            for number, bucket in enumerate(self.plan(tensors)):
                parts = [tensors[index].reshape(-1) for index in bucket.members]
                flat = (parts[0] if len(parts) == 1 else torch.cat(parts)).contiguous()
                if hashed:
                    hashes.append(hasher.submit(bucket_digest, [flat]))
                    if len(hashes) > HASHES_AHEAD:  # a slow hash holds back the broadcast, not memory
                        hashes[-1 - HASHES_AHEAD].result()
                if bucket.numel == 0:  # nothing to move (members make theirs up)
                    continue
                if self.terms.backend == "ipc":
                    self._hand_over(number, flat)
                else:
                    self._broadcast(flat.cpu() if self.terms.backend == "gloo" else flat)
            waited = time.perf_counter()
            digests = [future.result() for future in hashes]
            self.last_hash_wait_s = time.perf_counter() - waited
        self._updates += 1
        return digests

    def receive(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[str]) -> Iterator[torch.Tensor]:
        """A member: each tensor of one update, in order, on this member's device, as it arrives,
        unchecked (benchmarks and tests of the transfer; an actor takes ``receive_update``).

        The tensors are views into their bucket's buffer, which lives as long as one of them does:
        a consumer that copies each tensor and drops it (a model loader) holds one bucket at a time.
        """
        if self.rank == TRAINER_RANK:
            raise RuntimeError("weight-group rank 0 sends; members receive")
        plan = plan_buckets(shapes, dtypes, self.terms.bucket_bytes)
        for number, bucket in enumerate(plan):
            yield from _views(self._receive_bucket(number, bucket).to(self.device), bucket, shapes)
        self._updates += 1

    def receive_update(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[str]) -> ReceivedUpdate:
        """A member: every bucket of one update, received and hashed, nothing handed out yet.

        Bucket k is hashed on a thread of its own while bucket k+1 arrives, so the hash costs the
        update only where it outlasts the next transfer (``last_verify_s``: the time spent waiting for
        hashes after the last bucket). The caller compares the digests with the trainer's
        (``ReceivedUpdate.check``) before it takes any tensor: the collective is unauthenticated.
        """
        if self.rank == TRAINER_RANK:
            raise RuntimeError("weight-group rank 0 sends; members receive")
        plan = plan_buckets(shapes, dtypes, self.terms.bucket_bytes)
        buffers: list[torch.Tensor] = []
        hashes: list[Future[bytes]] = []
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bucket-hash") as hasher:
            for number, bucket in enumerate(plan):
                buffers.append(self._receive_bucket(number, bucket))
                hashes.append(hasher.submit(bucket_digest, [buffers[-1]]))
            waited = time.perf_counter()
            digests = [future.result() for future in hashes]
            self.last_verify_s = time.perf_counter() - waited
        self._updates += 1
        return ReceivedUpdate(plan, buffers, digests, [list(shape) for shape in shapes], self.device)

    def _receive_bucket(self, number: int, bucket: Bucket) -> torch.Tensor:
        """A member: bucket ``number``'s flattened buffer, where it arrived (the CPU for gloo)."""
        if bucket.numel == 0:
            return torch.empty(0, dtype=DTYPES[bucket.dtype], device=self.device)
        if self.terms.backend == "ipc":
            return self._take_over(number)
        wire_device = self.device if self.terms.backend == "nccl" else torch.device("cpu")
        flat = torch.empty(bucket.numel, dtype=DTYPES[bucket.dtype], device=wire_device)
        self._broadcast(flat)
        return flat

    def _hand_over(self, number: int, flat: torch.Tensor) -> None:
        """ipc, rank 0: publish the bucket's CUDA handle, wait until every member has copied it."""
        torch.cuda.current_stream(flat.device).synchronize()  # the bucket is written before it is shared
        key = f"ipc/{self._updates}/{number}"
        self._store.set(key, export(flat))  # type: ignore[arg-type]  # bytes pass as std::string
        self._barrier()
        self._store.delete_key(key)

    def _take_over(self, number: int) -> torch.Tensor:
        """ipc, a member: open rank 0's bucket, copy it to memory of our own, then release rank 0."""
        shared = open_exported(self._store.get(f"ipc/{self._updates}/{number}"))
        flat = shared.clone()
        torch.cuda.current_stream(flat.device).synchronize()
        del shared
        self._barrier()
        return flat

    def _barrier(self) -> None:
        self._group.allreduce([torch.zeros(1)]).wait()  # type: ignore[union-attr]

    def _broadcast(self, flat: torch.Tensor) -> None:
        self._group.broadcast(flat, TRAINER_RANK).wait()  # type: ignore[attr-defined,union-attr]


@dataclass(frozen=True)
class ReceivedUpdate:
    """A member's received update (``WeightGroup.receive_update``): every bucket's buffer where it
    arrived and the digest of its bytes. Nothing of it is used before ``check`` passes."""

    plan: list[Bucket]
    buffers: list[torch.Tensor]
    digests: list[bytes]
    shapes: list[list[int]]
    device: torch.device

    def check(self, announced: Sequence[bytes] | None) -> None:
        """``BucketsRefused`` naming every bucket whose bytes differ from the trainer's ``announced``
        digests (its ``WeightDigests``; None: they did not come); returns when every bucket matches."""
        refused, reason = refused_buckets(self.digests, announced)
        if refused:
            raise BucketsRefused(refused, reason)

    def tensors(self) -> Iterator[torch.Tensor]:
        """Each tensor of the update, in order, on the member's device (views into its bucket)."""
        for flat, bucket in zip(self.buffers, self.plan, strict=True):
            yield from _views(
                flat if flat.device == self.device else flat.to(self.device), bucket, self.shapes
            )


def _views(flat: torch.Tensor, bucket: Bucket, shapes: Sequence[Sequence[int]]) -> Iterator[torch.Tensor]:
    for index, offset, size in zip(bucket.members, bucket.offsets, bucket.sizes, strict=True):
        yield flat[offset : offset + size].view(list(shapes[index]))


def _store(host: str, port: int, world_size: int, rank: int, timeout: timedelta) -> dist.TCPStore:
    # Rank 0 serves it on transport.host only (``stores``): a TCPStore of its own listens everywhere.
    return host_store(host, port, world_size, is_master=rank == TRAINER_RANK, timeout=timeout)


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
