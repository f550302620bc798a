"""The weight group over real gloo process groups: rank 0 leads and sends, members join on its terms
and receive every tensor bit for bit, whatever the bucket size."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

from pipelinerl.platform.dtypes import dtype_name
from pipelinerl.platform.weights import MIB, TERMS_KEY, BucketsRefused, WeightGroup, weight_backend
from tests.conftest import worker_port

PORT = 28200  # 28200-28219
BUCKET_BYTES = 4096


def update() -> list[torch.Tensor]:
    """Tensors as a trainer has them: mixed sizes and dtypes, a non-contiguous one, an empty one."""
    generator = torch.Generator().manual_seed(0)
    return [
        torch.randn(64, 32, generator=generator),
        torch.randn(32, generator=generator),
        torch.randn(16, 48, generator=generator).t(),  # not contiguous
        torch.randn(0, 4, generator=generator),
        torch.randn(300, generator=generator).to(torch.bfloat16),
        torch.randn(7, 3, generator=generator).to(torch.bfloat16),
        torch.randn(5000, generator=generator),  # 20,000 bytes: larger than the small buckets
        torch.randn(1, generator=generator),
        torch.randn(0, generator=generator),  # a bucket of its own at the smallest sizes: nothing sent
    ]


def form(port: int, members: int, **lead: Any) -> tuple[WeightGroup, list[WeightGroup]]:
    joined: dict[int, WeightGroup] = {}
    errors: list[BaseException] = []

    def join(rank: int) -> None:
        try:
            joined[rank] = WeightGroup.join("127.0.0.1", port, rank, 1 + members, timeout_s=60)
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=join, args=(rank,), daemon=True) for rank in range(1, 1 + members)]
    for thread in threads:
        thread.start()
    leader = WeightGroup.lead("127.0.0.1", port, 1 + members, timeout_s=60, **lead)
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return leader, [joined[rank] for rank in sorted(joined)]


@pytest.mark.parametrize(("slot", "bucket_bytes"), [(0, 1), (1, 4096), (2, 256 * MIB)])
def test_members_receive_every_tensor_exactly_in_buckets_of_any_size(slot, bucket_bytes):
    leader, members = form(worker_port(PORT + slot), members=2, bucket_bytes=bucket_bytes)
    assert all(m.terms == leader.terms for m in members), "members must take the leader's terms"
    tensors = update()
    shapes = [list(t.shape) for t in tensors]
    dtypes = [str(t.dtype).removeprefix("torch.") for t in tensors]
    received: dict[int, list[torch.Tensor]] = {}

    def receive(member: WeightGroup) -> None:
        received[member.rank] = list(member.receive(shapes, dtypes))

    threads = [threading.Thread(target=receive, args=(m,), daemon=True) for m in members]
    for thread in threads:
        thread.start()
    leader.send(tensors)
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(received) == [1, 2]
    for got in received.values():
        assert len(got) == len(tensors)
        for sent, arrived in zip(tensors, got, strict=True):
            assert arrived.shape == sent.shape and arrived.dtype == sent.dtype
            assert torch.equal(arrived, sent)


def test_the_leader_sends_and_members_receive_never_the_other_way():
    leader, (member,) = form(worker_port(PORT + 5), members=1)
    with pytest.raises(RuntimeError, match="only rank 0 sends"):
        member.send([torch.zeros(1)])
    with pytest.raises(RuntimeError, match="members receive"):
        next(leader.receive([[1]], ["float32"]))


def test_a_member_on_the_cpu_refuses_an_nccl_group_naming_the_setting():
    """The terms reach the member before any NCCL call: a CPU member (or leader) says what to change."""
    port = worker_port(PORT + 6)
    store = dist.TCPStore(
        "127.0.0.1", port, 2, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False
    )
    store.set(TERMS_KEY, json.dumps({"backend": "nccl", "bucket_bytes": MIB}))
    with pytest.raises(ValueError, match="group rank 1 is on 'cpu', not a CUDA GPU.*weight_backend='gloo'"):
        WeightGroup.join("127.0.0.1", port, 1, 2, timeout_s=10)
    with pytest.raises(ValueError, match="group rank 0 is on 'cpu', not a CUDA GPU"):
        WeightGroup.lead("127.0.0.1", worker_port(PORT + 9), 2, backend="nccl", device="cpu", timeout_s=10)


def test_a_rank_zero_join_and_impossible_terms_are_refused():
    with pytest.raises(ValueError, match="rank 0 is the trainer's"):
        WeightGroup.join("127.0.0.1", worker_port(PORT + 7), 0, 2, timeout_s=5)
    with pytest.raises(ValueError, match="at least 1 byte"):
        WeightGroup.lead("127.0.0.1", worker_port(PORT + 8), 2, bucket_bytes=0, timeout_s=5)


@pytest.mark.parametrize(
    ("setting", "device", "engine", "expected"),
    [
        ("auto", "cuda", "vllm", "nccl"),
        ("auto", "cpu", "vllm", "gloo"),
        ("auto", "cuda", "transformers", "gloo"),
        ("gloo", "cuda", "vllm", "gloo"),
        ("nccl", "cuda", "vllm", "nccl"),
    ],
)
def test_the_backend_follows_where_the_two_sides_run(setting, device, engine, expected):
    assert weight_backend(setting, device, engine) == expected


def test_colocated_on_one_gpu_the_backend_is_cuda_ipc_and_never_nccl():
    assert weight_backend("auto", "cuda", "vllm", colocate=True) == "ipc"
    assert weight_backend("gloo", "cuda", "vllm", colocate=True) == "gloo"
    with pytest.raises(ValueError, match="cannot join two processes on one GPU"):
        weight_backend("nccl", "cuda", "vllm", colocate=True)
    with pytest.raises(ValueError, match="needs cluster.colocate=true"):
        weight_backend("ipc", "cuda", "vllm", colocate=False)


def test_nccl_asked_for_a_cpu_trainer_is_refused_naming_the_values():
    with pytest.raises(ValueError, match="trainer.device resolved to 'cpu'"):
        weight_backend("nccl", "cpu", "vllm")
    with pytest.raises(ValueError, match="not one of auto, gloo, nccl"):
        weight_backend("mpi", "cpu", "vllm")


def _member(port: int, backend: str, shapes: list, dtypes: list, results: Any) -> None:
    """A member process on its GPU (CUDA IPC cannot open a handle in the process that exported it)."""
    device = torch.device("cuda", 0 if backend == "ipc" else 1)
    torch.cuda.set_device(device)
    group = WeightGroup.join("127.0.0.1", port, 1, 2, timeout_s=120, device=device)
    results.put([tensor.cpu() for tensor in group.receive(shapes, dtypes)])
    results.put([tensor.cpu() for tensor in group.receive(shapes, dtypes)])  # a second update


@pytest.mark.gpu
@pytest.mark.parametrize(("backend", "gpus"), [("ipc", 1), ("nccl", 2)])
def test_gpu_members_receive_every_tensor_exactly(backend, gpus):
    """ipc: the trainer and a member share GPU 0 (cluster.colocate); nccl: the member on GPU 1."""
    if torch.cuda.device_count() < gpus:
        pytest.skip(f"{backend} between two processes needs {gpus} GPU(s), found {torch.cuda.device_count()}")
    port = worker_port(PORT + 10 + gpus)
    tensors = [t.cuda(0) for t in update()]
    shapes = [list(t.shape) for t in tensors]
    dtypes = [str(t.dtype).removeprefix("torch.") for t in tensors]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    member = context.Process(target=_member, args=(port, backend, shapes, dtypes, results), daemon=True)
    member.start()
    try:
        leader = WeightGroup.lead(
            "127.0.0.1", port, 2, backend=backend, bucket_bytes=4096, device=torch.device("cuda", 0)
        )
        for scale in (1.0, -2.0):
            sent = [t * scale for t in tensors]
            leader.send(sent)
            received = results.get(timeout=120)
            assert all(torch.equal(a.cpu(), b) for a, b in zip(sent, received, strict=True))
    finally:
        member.join(timeout=60)
        if member.is_alive():
            member.kill()


# ----- digests: an injected bucket is refused (more in test_weight_digest_refusal.py) -----


class InjectingGroup(WeightGroup):
    """Trainer rank 0 whose broadcast number ``tampered`` of an update (0, 1, ...; the bucket of that
    number where no bucket is empty) carries other bytes than those it hashed for its digests: what
    a stranger injecting into the unauthenticated collective achieves. Only ``_broadcast`` differs."""

    tampered: int | None = None
    broadcasts = 0

    def send(self, tensors: Sequence[torch.Tensor], *, hashed: bool = True) -> list[bytes]:
        self.broadcasts = 0
        return super().send(tensors, hashed=hashed)

    def _broadcast(self, flat: torch.Tensor) -> None:
        if self.broadcasts == self.tampered:
            flat = flat.clone()  # a one-tensor bucket is a view of the trainer's own weights
            flat.view(torch.uint8)[3] ^= 0x10
        self.broadcasts += 1
        super()._broadcast(flat)


def digested_update(scale: float) -> list[torch.Tensor]:
    """Four buckets of 4096 bytes: 1024 float32, 1024 float32, 2048 bfloat16, then 16 float32."""
    generator = torch.Generator().manual_seed(1)
    return [
        scale * torch.randn(32, 32, generator=generator),
        scale * torch.randn(1024, generator=generator),
        (scale * torch.randn(64, 32, generator=generator)).to(torch.bfloat16),
        scale * torch.randn(4, 4, generator=generator),
    ]


def _digest_member(port: int, shapes: list, dtypes: list, notices: Any, out: Any, read: Any) -> None:
    """A member process: receive each update as an actor stages it (all of it, or nothing), checked
    against the trainer's digests (``notices``: as the actor's notice socket hands them over, after
    the broadcast)."""
    group = WeightGroup.join("127.0.0.1", port, 1, 2, timeout_s=60)
    for _ in range(2):
        update = group.receive_update(shapes, dtypes)
        try:
            update.check(notices.get(timeout=60))
            out.put(("received", [t.clone() for t in update.tensors()]))
        except BucketsRefused as refused:
            out.put(("refused", refused.buckets))
    # Tensors cross the queue by file descriptor, served by this process: stay until they are read.
    read.wait(timeout=60)


def test_a_member_process_refuses_an_injected_bucket_and_the_next_update_arrives_whole() -> None:
    port = worker_port(PORT + 15)
    tampered, clean = digested_update(1.0), digested_update(-2.0)
    shapes, dtypes = [list(t.shape) for t in tampered], [dtype_name(t) for t in tampered]
    context = multiprocessing.get_context("spawn")
    notices, out, read = context.Queue(), context.Queue(), context.Event()
    member = context.Process(
        target=_digest_member, args=(port, shapes, dtypes, notices, out, read), daemon=True
    )
    member.start()
    try:
        leader = InjectingGroup.lead("127.0.0.1", port, 2, bucket_bytes=BUCKET_BYTES, timeout_s=60)
        assert len(leader.plan(tampered)) == 4
        started = time.monotonic()
        # As the trainer does: the digests of what it sent, announced after the broadcast.
        leader.tampered = 2  # the bfloat16 bucket
        notices.put(leader.send(tampered))  # returns: the member took part in every broadcast
        leader.tampered = None
        notices.put(leader.send(clean))
        assert time.monotonic() - started < 30
        assert out.get(timeout=30) == ("refused", [2])
        kind, received = out.get(timeout=30)
        read.set()
        assert kind == "received"
        assert all(torch.equal(a, b) for a, b in zip(clean, received, strict=True))
    finally:
        read.set()
        member.join(timeout=30)
        if member.is_alive():
            member.kill()
