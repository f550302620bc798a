"""``pipelinerl bench weights``: one weight update from trainer rank 0 to the weight group's members, by
bucket size (``transport.weight_bucket_mib``), on the platform's ``WeightGroup``.

The model is a Llama-shaped causal LM built from its config with random weights (no download), so the
tensor count and sizes are a real model's. Each bucket size gets a weight group of its own (the size is
one of the group's terms) with fresh member processes, which copy every received tensor into a model
of their own and drop it, as a loader does. Measured per update: the time from the leader's first send
to the last member's last tensor, and per member the peak memory the update added beyond its model.
A bucket of 1 byte is the old behaviour: one broadcast per tensor.

Each repeat times two updates back to back: one verified as a run verifies it (``weight_digest``:
the leader hashes every bucket while it broadcasts it and hands the digests over after the
broadcast, as the trainer's ``WeightDigests``; each member hashes every bucket while the next one
arrives, compares, and only then copies anything), and one plain (no hashing on either side,
tensors copied as they arrive). The digest's cost is the difference of the two medians, as a share
of the verified update's time; also reported: how long each side waited for its hashes once its
last bucket had gone or arrived (what the overlap did not hide).
"""

from __future__ import annotations

import multiprocessing
import resource
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from pipelinerl.bench.report import markdown_table
from pipelinerl.platform.dtypes import DTYPES, dtype_name
from pipelinerl.platform.tracking.ratios import times_faster, times_faster_key
from pipelinerl.platform.weight_buckets import plan_buckets
from pipelinerl.platform.weight_digest import ALGORITHM
from pipelinerl.platform.weights import WeightGroup

MIB = 1 << 20


@dataclass(frozen=True)
class WeightsBenchSettings:
    hidden_size: int = 1024
    layers: int = 8
    vocab_size: int = 32000
    members: int = 1
    bucket_bytes: tuple[int, ...] = (1, 4 * MIB, 32 * MIB, 256 * MIB)
    repeats: int = 5
    port: int = 28300  # one port per bucket size from here
    seed: int = 0

    @classmethod
    def quick(cls, port: int = 28300) -> WeightsBenchSettings:
        return cls(hidden_size=128, layers=2, vocab_size=1000, repeats=2, bucket_bytes=(1, MIB), port=port)


def build_tensors(settings: WeightsBenchSettings) -> list[tuple[str, Any]]:
    """The named parameters of a Llama-shaped model with random weights, float32, on CPU."""
    from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: PLC0415 (transformers: the spawned members import this module)

    torch.manual_seed(settings.seed)
    config = LlamaConfig(
        vocab_size=settings.vocab_size,
        hidden_size=settings.hidden_size,
        intermediate_size=int(settings.hidden_size * 8 / 3) // 64 * 64,
        num_hidden_layers=settings.layers,
        num_attention_heads=max(1, settings.hidden_size // 64),
        tie_word_embeddings=False,
    )
    model = AutoModelForCausalLM.from_config(config)
    return [(name, param.detach()) for name, param in model.named_parameters()]


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _member(
    port: int, rank: int, world: int, shapes: list, dtypes: list, repeats: int, notices: Any, out: Any
) -> None:
    """A member process: a model-sized destination, then ``repeats`` pairs of updates copied into
    it: one checked against the digests the leader hands over after its broadcast (``notices``, as
    the trainer's ``WeightDigests`` arrive), one plain."""
    torch.set_num_threads(1)
    destination = [
        torch.zeros(shape, dtype=DTYPES[dtype]) for shape, dtype in zip(shapes, dtypes, strict=True)
    ]
    group = WeightGroup.join("127.0.0.1", port, rank, world, timeout_s=120)
    baseline = _peak_rss_bytes()
    for _ in range(repeats):
        update = group.receive_update(shapes, dtypes)
        update.check(notices.get(timeout=300))
        for target, tensor in zip(destination, update.tensors(), strict=True):
            target.copy_(tensor)
        del update
        out.put(("checked", rank, time.perf_counter(), group.last_verify_s))
        for target, tensor in zip(destination, group.receive(shapes, dtypes), strict=True):
            target.copy_(tensor)
        out.put(("plain", rank, time.perf_counter(), 0.0))
    out.put(("memory", rank, _peak_rss_bytes() - baseline))


def measure_bucket_size(
    settings: WeightsBenchSettings, tensors: list[Any], bucket_bytes: int, port: int
) -> dict[str, Any]:
    """Time ``settings.repeats`` pairs of updates (verified, plain) through a group whose buckets are
    at most ``bucket_bytes``."""
    shapes = [list(t.shape) for t in tensors]
    dtypes = [dtype_name(t) for t in tensors]
    world = 1 + settings.members
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    notices = [context.Queue() for _ in range(1, world)]
    members = [
        context.Process(
            target=_member,
            args=(port, rank, world, shapes, dtypes, settings.repeats, notices[rank - 1], out),
        )
        for rank in range(1, world)
    ]
    for process in members:
        process.start()
    try:
        leader = WeightGroup.lead("127.0.0.1", port, world, bucket_bytes=bucket_bytes, timeout_s=120)
        checked_ms, plain_ms, hash_wait_ms, verify_wait_ms = [], [], [], []
        for _ in range(settings.repeats):
            started = time.perf_counter()
            digests = leader.send(tensors)
            for queue in notices:
                queue.put(digests)
            finished = [out.get(timeout=300) for _ in range(settings.members)]
            checked_ms.append(1000 * (max(at for _, _, at, _ in finished) - started))
            hash_wait_ms.append(1000 * leader.last_hash_wait_s)
            verify_wait_ms.append(1000 * max(waited for _, _, _, waited in finished))
            started = time.perf_counter()
            leader.send(tensors, hashed=False)
            finished = [out.get(timeout=300) for _ in range(settings.members)]
            plain_ms.append(1000 * (max(at for _, _, at, _ in finished) - started))
        extra = [out.get(timeout=60)[2] for _ in range(settings.members)]
    finally:
        for process in members:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    total_bytes = sum(t.numel() * t.element_size() for t in tensors)
    median_ms, plain_median_ms = statistics.median(checked_ms), statistics.median(plain_ms)
    return {
        "bucket_bytes": bucket_bytes,
        "buckets_per_update": len(plan_buckets(shapes, dtypes, bucket_bytes)),
        "update_ms_median": round(median_ms, 1),
        "update_ms_max": round(max(checked_ms), 1),
        "mb_per_s": round(total_bytes / 1e6 / (median_ms / 1000), 1),
        "member_peak_extra_mib": round(max(extra) / MIB, 1),
        "update_ms": [round(value, 1) for value in checked_ms],
        "plain_update_ms_median": round(plain_median_ms, 1),
        "plain_update_ms": [round(value, 1) for value in plain_ms],
        "trainer_hash_wait_ms_median": round(statistics.median(hash_wait_ms), 1),
        "member_hash_wait_ms_median": round(statistics.median(verify_wait_ms), 1),
        "digest_share_median": round((median_ms - plain_median_ms) / median_ms, 3),
    }


def run_weights_bench(settings: WeightsBenchSettings, progress: Any) -> dict[str, Any]:
    named = build_tensors(settings)
    tensors = [tensor for _, tensor in named]
    model_bytes = sum(t.numel() * t.element_size() for t in tensors)
    task = progress.add_task("bucket sizes", total=len(settings.bucket_bytes))
    rows = []
    for offset, bucket_bytes in enumerate(settings.bucket_bytes):
        rows.append(measure_bucket_size(settings, tensors, bucket_bytes, settings.port + offset))
        progress.advance(task)
    per_tensor = next((row for row in rows if row["bucket_bytes"] == 1), None)
    fastest = min(rows, key=lambda row: row["update_ms_median"])
    headline = {
        "model_mib": round(model_bytes / MIB, 1),
        "tensors": len(tensors),
        "fastest_bucket_mib": round(fastest["bucket_bytes"] / MIB, 3),
        "fastest_update_ms": fastest["update_ms_median"],
        # (verified update - plain update) / verified update, medians over the repeats.
        "digest_share_at_fastest": fastest["digest_share_median"],
        # How many times faster the fastest bucket size updates than one broadcast per tensor (records
        # before issue 25: ``speedup_over_per_tensor``, same direction).
        times_faster_key("fastest", "per_tensor"): _rounded(
            times_faster(
                run_s=fastest["update_ms_median"],
                baseline_s=per_tensor["update_ms_median"] if per_tensor else None,
            )
        ),
    }
    return {
        "headline": headline,
        "details": {"bucket_sizes": rows},
        "notes": [
            "gloo over loopback on this machine (a CPU group); each member copies every tensor into a "
            "model of its own and drops it, as vLLM's loader does",
            "update time: the leader's first broadcast to the last member's last tensor copied; member "
            "peak extra: the rise of the member's peak RSS over the updates, beyond its model (a "
            "verified update is held whole until its digests match)",
            f"digest ({ALGORITHM}): the leader hashes each bucket while it broadcasts it and hands the "
            "digests over after the broadcast, each member hashes each bucket while the next arrives "
            "and compares before it copies; share = (verified - plain) / verified, medians; hash waits: "
            "time spent waiting for hashes after the last bucket",
        ],
        "settings": asdict(settings),
    }


def _rounded(ratio: float | None) -> float | None:
    return None if ratio is None else round(ratio, 2)


def render_weights_table(record: dict[str, Any]) -> str:
    rows = [
        [
            "per tensor" if row["bucket_bytes"] == 1 else f"{row['bucket_bytes'] / MIB:g}",
            row["buckets_per_update"],
            row["update_ms_median"],
            row["update_ms_max"],
            row["mb_per_s"],
            row["member_peak_extra_mib"],
            row["plain_update_ms_median"],
            row["trainer_hash_wait_ms_median"],
            row["member_hash_wait_ms_median"],
            f"{100 * row['digest_share_median']:.0f} %",
        ]
        for row in record["bucket_sizes"]
    ]
    headers = [
        "bucket (MiB)",
        "broadcasts per update",
        "update median (ms)",
        "update max (ms)",
        "MB/s",
        "member peak extra (MiB)",
        "plain update median (ms)",
        "trainer hash wait (ms)",
        "member hash wait (ms)",
        "digest share of update",
    ]
    return markdown_table(headers, rows)
