"""What a run's roles need in memory and GPUs: arithmetic on the model's shape and the config's settings.

Pure (no torch, no I/O) so that every figure can be checked by hand in the tests; ``config_fit`` gathers
the inputs (the model's shape, this machine's GPUs and memory) and turns the figures into checks. The
figures are what the model state needs; the fit adds a stated margin for what they leave out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
FP32_BYTES = 4
# AdamW keeps two moments per parameter (exp_avg, exp_avg_sq), in fp32 whatever the weights' dtype.
ADAM_MOMENTS = 2
# What the model state leaves out, in the fit: activations and the allocator's slack (this factor on the
# model state), and each process's own footprint (interpreter, torch, a CUDA context: this many GiB).
ACTIVATION_MARGIN = 1.25
PROCESS_FOOTPRINT_GIB = 1.0
# Above this share of the room a fit is a WARN: other programs and fragmentation take the rest. A GPU's is
# higher: vLLM takes actor.gpu_memory_utilization (0.9 by default) of its GPU by design.
WARN_SHARE = 0.8
GPU_WARN_SHARE = 0.95

Fit = Literal["PASS", "WARN", "FAIL"]


def size(nbytes: float) -> str:
    """Bytes for a report line: MiB below 1 GiB (the tiny model), else GiB."""
    value = nbytes / GIB
    if value < 1:
        return f"{nbytes / 2**20:.1f} MiB"
    return f"{value:.2f} GiB" if value < 10 else f"{value:.1f} GiB"


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on: the parameters (tied weights counted once) and the attention's KV shape."""

    params: int
    layers: int
    kv_heads: int
    head_dim: int

    def kv_bytes_per_token(self, dtype: str) -> int:
        """Keys and values of one token over every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class TrainerRankNeed:
    """One trainer rank's model state in bytes, as DeepSpeed ZeRO shards it over the ranks."""

    dtype: str
    weights: float
    grads: float
    optimizer: float  # Adam moments, plus fp32 master weights when the weights are in 16 bits
    offloaded: bool  # the optimizer state lives in host memory (trainer.offload_optimizer)
    reference: float = 0.0  # the KL term's frozen reference (rl.kl.coef > 0): a whole copy, never sharded

    @property
    def device(self) -> float:
        """On the rank's device (its GPU, or host memory on CPU)."""
        return self.weights + self.grads + (0.0 if self.offloaded else self.optimizer) + self.reference

    @property
    def host(self) -> float:
        """Offloaded to host memory beside the device's share."""
        return self.optimizer if self.offloaded else 0.0

    @property
    def total(self) -> float:
        return self.device + self.host


def trainer_rank_need(
    params: int,
    dtype: str,
    ranks: int,
    zero_stage: int,
    offload_optimizer: bool,
    reference_model: bool = False,
) -> TrainerRankNeed:
    """Weights and grads at ``dtype``, Adam's fp32 moments (and fp32 master weights under 16-bit weights);
    ZeRO stage 1 shards the optimizer state over ``ranks``, 2 the grads too, 3 the weights too. With
    ``reference_model`` (a KL term) every rank also holds a whole frozen copy of the weights at ``dtype``."""
    width = DTYPE_BYTES[dtype]
    optimizer = float(params * FP32_BYTES * (ADAM_MOMENTS + (1 if width < FP32_BYTES else 0)))
    weights, grads = float(params * width), float(params * width)
    if zero_stage >= 1:
        optimizer /= ranks
    if zero_stage >= 2:
        grads /= ranks
    if zero_stage >= 3:
        weights /= ranks
    reference = float(params * width) if reference_model else 0.0
    return TrainerRankNeed(dtype, weights, grads, float(optimizer), offload_optimizer, reference)


@dataclass(frozen=True)
class ActorNeed:
    """One actor's weights and KV cache in bytes: the cache it reserves against the cache H full
    sequences need."""

    dtype: str
    weights: float
    kv_per_token: int
    sequence_tokens: int  # prompt budget + actor.max_new_tokens
    max_in_flight: int
    kv_reserved: float | None  # None: not known here (a vLLM actor on a pool node's GPU)

    @property
    def kv_full(self) -> float:
        """The cache ``max_in_flight`` sequences of ``sequence_tokens`` tokens need."""
        return float(self.kv_per_token * self.sequence_tokens * self.max_in_flight)

    @property
    def sequences_held(self) -> int | None:
        """Full sequences the reserved cache holds (None: not known here)."""
        if self.kv_reserved is None:
            return None
        return int(self.kv_reserved // (self.kv_per_token * self.sequence_tokens))

    @property
    def total(self) -> float:
        """Weights and cache (the cache H full sequences need where the reservation is not known)."""
        return self.weights + (self.kv_full if self.kv_reserved is None else self.kv_reserved)


def transformers_cache_blocks(
    kv_cache_blocks: int, kv_block_size: int, max_in_flight: int, sequence_tokens: int
) -> int:
    """The transformers engine's blocks: ``actor.kv_cache_blocks``, or with 0 room for H full sequences
    and one block more (transformers_engine.py)."""
    return kv_cache_blocks or max_in_flight * math.ceil(sequence_tokens / kv_block_size) + 1


def vllm_cache_bytes(
    *,
    kv_cache_gib: float | None,
    on_gpu: bool,
    cpu_default_gib: float,
    gpu_memory_utilization: float,
    gpu_memory: float,
    weights: float,
    tensor_parallel_size: int,
) -> float:
    """The most KV cache a vLLM actor reserves: ``actor.kv_cache_gib`` on each of its GPUs when set; on
    CPU the engine's default when empty; on GPUs what ``gpu_memory_utilization`` of their memory leaves
    beside the weights (vLLM's activations take some of that too, so the cache is at most this)."""
    if kv_cache_gib is not None:
        return kv_cache_gib * GIB * (tensor_parallel_size if on_gpu else 1)
    if not on_gpu:
        return cpu_default_gib * GIB
    return max(0.0, gpu_memory_utilization * gpu_memory * tensor_parallel_size - weights)


def actor_need(
    shape: ModelShape, dtype: str, max_in_flight: int, sequence_tokens: int, kv_reserved: float | None
) -> ActorNeed:
    return ActorNeed(
        dtype,
        float(shape.params * DTYPE_BYTES[dtype]),
        shape.kv_bytes_per_token(dtype),
        sequence_tokens,
        max_in_flight,
        kv_reserved,
    )


@dataclass(frozen=True)
class GpuNeed:
    """GPUs a local run takes: one per trainer rank on cuda, then ``tensor_parallel_size`` per vLLM actor
    on GPUs (none more when colocated: the actor shares trainer rank 0's GPU)."""

    trainer: int
    actors: int

    @property
    def total(self) -> int:
        return self.trainer + self.actors


def gpu_need(
    *, trainer_on_cuda: bool, ranks: int, actors_on_gpu: bool, num_actors: int, tp: int, colocate: bool
) -> GpuNeed:
    trainer = ranks if trainer_on_cuda else 0
    actors = num_actors * tp if actors_on_gpu and not colocate else 0
    return GpuNeed(trainer, actors)


def with_margin(model_state: float) -> float:
    """A process's memory from its model state: the activation margin and its own footprint."""
    return model_state * ACTIVATION_MARGIN + PROCESS_FOOTPRINT_GIB * GIB


def fit(need: float, room: float, warn_share: float = WARN_SHARE) -> Fit:
    """FAIL when ``need`` exceeds ``room``, WARN above ``warn_share`` of it."""
    if need > room:
        return "FAIL"
    return "WARN" if need > warn_share * room else "PASS"
