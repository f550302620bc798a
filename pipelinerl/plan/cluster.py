"""A cluster to plan for (``--cluster actors=96xH100,trainers=32xH100``), and a profile scaled to it.

A GPU profile (one with ``hardware``, ``plan/profile.py``) gives an engine's decode costs on
``gpus_per_engine`` GPUs and the trainer's step costs on ``trainer_gpus`` GPUs. On a cluster of that
GPU with A actor GPUs and T trainer GPUs:

* the engines are A / ``gpus_per_engine`` (each with the profile's decode and prefill costs);
* the trainer's per-token and per-sequence costs scale by ``trainer_gpus / T``: data parallelism
  divides a step's tokens among the ranks; its fixed cost does not shrink (the optimizer step, the
  all-reduce's latency). This is the ideal: at thousands of tokens per rank a real trainer keeps most of
  it (the figures' sources say how much), far fewer and it keeps less;
* the transfer stays what the profile says: the trainer's broadcast is bound by the bytes and the
  slowest link, not by how many engines receive them (NCCL pipelines a broadcast along a ring or tree).

Before simulating, the cluster must hold the model: an engine's GPUs its bf16 weights (2 bytes a
parameter) with room for a KV cache (``ENGINE_WEIGHT_SHARE`` of their memory at most), and the trainer
GPUs its training state under the config's ZeRO stage (``trainer_state_bytes``: bf16 weights and
gradients, fp32 master weights and Adam's two moments, 16 bytes a parameter, of which stage 1 shards the
optimizer's 12 over the trainer GPUs, stage 2 also the gradients, stage 3 everything) with
``TRAIN_STATE_SHARE`` of their memory at most.

Where the profile gives the model's KV bytes a token (``hardware.kv_bytes_per_token``):

* an engine holds at most as many sequences as its KV cache holds at their mean length
  (``kv_cache_sequences``: ``actor.gpu_memory_utilization`` of its GPUs less the weights, over a
  sequence's tokens), so H is capped there, as vLLM's scheduler admits no more than its blocks hold;
* under ZeRO-3 each step also gathers the bf16 weights once more than under stages 0-2 (the ZeRO paper,
  arXiv 1910.02054 section 7: 1.5 times data parallelism's traffic), at the trainer link's bandwidth
  (``zero_step_extra_s``; the profile's step figures are for ``hardware.zero_stage``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from pipelinerl.plan.costs import CostModel
from pipelinerl.plan.profile import CostProfile, Hardware

GIB = 2**30
# Memory per GPU, bytes: the makers' datasheets (H100 SXM 80 GB, H200 141 GB, A100 80 GB, L40S 48 GB).
GPUS: dict[str, int] = {"H100": 80 * 10**9, "H200": 141 * 10**9, "A100": 80 * 10**9, "L40S": 48 * 10**9}
ENGINE_WEIGHT_SHARE = 0.5  # an engine's weights may take half its GPUs' memory; the rest is KV cache
TRAIN_BYTES_PER_PARAM = 16  # bf16 weights (2) + bf16 grads (2) + fp32 master (4) + Adam's moments (8)
WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 2, 12  # of the 16, what ZeRO's stages shard in turn
TRAIN_STATE_SHARE = 0.7  # what is left holds the activations

CLUSTER_FORM = "actors=<N>x<GPU>,trainers=<N>x<GPU> (e.g. actors=96xH100,trainers=32xH100)"
_PART = re.compile(r"^(actors|trainers)=(\d+)x([A-Za-z0-9]+)$")


class ClusterError(ValueError):
    """A cluster that cannot be read, or cannot run the configuration, naming the value."""


@dataclass(frozen=True)
class Cluster:
    actor_gpus: int
    trainer_gpus: int
    gpu: str

    @property
    def total(self) -> int:
        return self.actor_gpus + self.trainer_gpus

    def with_actor_gpus(self, actor_gpus: int) -> Cluster:
        """The same cluster split otherwise: ``actor_gpus`` act, the rest of its GPUs train."""
        total = self.total
        if not 0 < actor_gpus < total:
            raise ClusterError(
                f"actor_gpus={actor_gpus}: the cluster has {total} GPUs; between 1 and {total - 1} act "
                "(the rest train)"
            )
        return replace(self, actor_gpus=actor_gpus, trainer_gpus=total - actor_gpus)

    def __str__(self) -> str:
        return f"actors={self.actor_gpus}x{self.gpu},trainers={self.trainer_gpus}x{self.gpu}"


def parse_cluster(text: str) -> Cluster:
    """``actors=96xH100,trainers=32xH100``; ``ClusterError`` naming what is wrong."""
    parts: dict[str, tuple[int, str]] = {}
    for part in text.replace(" ", "").split(","):
        match = _PART.match(part)
        if match is None:
            raise ClusterError(f"cluster {text!r}: cannot read {part!r}; expected {CLUSTER_FORM}")
        role, count, gpu = match.group(1), int(match.group(2)), match.group(3)
        if role in parts:
            raise ClusterError(f"cluster {text!r}: {role} given twice")
        canonical = {name.lower(): name for name in GPUS}.get(gpu.lower())
        if canonical is None:
            raise ClusterError(f"cluster {text!r}: unknown GPU {gpu!r}; the GPUs known are {', '.join(GPUS)}")
        if count < 1:
            raise ClusterError(f"cluster {text!r}: {role}={count}x{gpu}: at least 1 GPU")
        parts[role] = (count, canonical)
    missing = [role for role in ("actors", "trainers") if role not in parts]
    if missing:
        raise ClusterError(f"cluster {text!r}: {' and '.join(missing)} missing; expected {CLUSTER_FORM}")
    (actors, actor_gpu), (trainers, trainer_gpu) = parts["actors"], parts["trainers"]
    if actor_gpu != trainer_gpu:
        raise ClusterError(
            f"cluster {text!r}: actors on {actor_gpu}, trainers on {trainer_gpu}; a profile describes one "
            "GPU, so plan a cluster of one kind"
        )
    return Cluster(actor_gpus=actors, trainer_gpus=trainers, gpu=actor_gpu)


def hardware_of(profile: CostProfile) -> Hardware:
    if profile.hardware is None:
        raise ClusterError(
            f"profile {profile.name!r} says nothing of the hardware it was measured on (no 'hardware' "
            "section: a profile calibrated on this machine's runs); --cluster needs a GPU profile"
        )
    return profile.hardware


def check_fits(hardware: Hardware, cluster: Cluster, zero_stage: int = 3) -> None:
    """``ClusterError`` if the cluster cannot hold the model (trained under ``zero_stage``): naming the
    side, the need and the room."""
    if cluster.gpu != hardware.gpu:
        raise ClusterError(
            f"cluster of {cluster.gpu}, profile measured on {hardware.gpu}: plan with a profile of "
            f"{cluster.gpu} (pipelinerl plan profiles lists them)"
        )
    memory = GPUS[cluster.gpu]
    params = hardware.model_params_b * 1e9
    if cluster.actor_gpus < hardware.gpus_per_engine or cluster.actor_gpus % hardware.gpus_per_engine:
        raise ClusterError(
            f"actors={cluster.actor_gpus}x{cluster.gpu}: an engine takes {hardware.gpus_per_engine} GPUs "
            f"(the profile's tensor parallelism), so the actor GPUs must be a multiple of it"
        )
    weights = 2 * params
    engine_room = ENGINE_WEIGHT_SHARE * memory * hardware.gpus_per_engine
    if weights > engine_room:
        raise ClusterError(
            f"a {hardware.model_params_b:g}B model's bf16 weights ({weights / GIB:.0f} GiB) do not fit an "
            f"engine of {hardware.gpus_per_engine}x{cluster.gpu} with room for its KV cache (at most "
            f"{engine_room / GIB:.0f} GiB); use a profile with more GPUs per engine"
        )
    state = trainer_state_bytes(params, cluster.trainer_gpus, zero_stage)
    train_room = TRAIN_STATE_SHARE * memory
    if state > train_room:
        fits = [n for n in range(1, 4097) if trainer_state_bytes(params, n, zero_stage) <= train_room]
        need = f"at least {fits[0]} trainer GPUs" if fits else "no number of trainer GPUs holds it"
        if zero_stage < 3:
            need += f", or a higher trainer.zero_stage (now {zero_stage})"
        raise ClusterError(
            f"trainers={cluster.trainer_gpus}x{cluster.gpu} cannot hold a {hardware.model_params_b:g}B "
            f"model's training state ({state / GIB:.0f} GiB per GPU under ZeRO-{zero_stage}, at most "
            f"{train_room / GIB:.0f} GiB): {need}"
        )


def trainer_state_bytes(params: float, trainer_gpus: int, zero_stage: int) -> float:
    """The training state one trainer GPU holds: what ZeRO's stage shards divided among the GPUs."""
    if zero_stage not in (0, 1, 2, 3):
        raise ClusterError(f"trainer.zero_stage={zero_stage}: DeepSpeed's stages are 0, 1, 2 and 3")
    sharded = (
        (OPTIMIZER_BYTES, OPTIMIZER_BYTES + GRAD_BYTES, TRAIN_BYTES_PER_PARAM)[zero_stage - 1]
        if zero_stage
        else 0
    )
    return params * ((TRAIN_BYTES_PER_PARAM - sharded) + sharded / trainer_gpus)


def kv_cache_sequences(
    hardware: Hardware, gpu: str, gpu_memory_utilization: float, tokens_per_sequence: float
) -> int | None:
    """The sequences an engine's KV cache holds at ``tokens_per_sequence`` each (None: the profile does
    not give the model's KV bytes a token); ``ClusterError`` if it holds none."""
    if hardware.kv_bytes_per_token is None:
        return None
    room = gpu_memory_utilization * GPUS[gpu] * hardware.gpus_per_engine - 2 * hardware.model_params_b * 1e9
    sequences = int(room // (hardware.kv_bytes_per_token * tokens_per_sequence)) if room > 0 else 0
    if sequences < 1:
        raise ClusterError(
            f"an engine of {hardware.gpus_per_engine}x{gpu} at actor.gpu_memory_utilization="
            f"{gpu_memory_utilization} leaves {max(room, 0) / GIB:.1f} GiB for the KV cache, less than one "
            f"sequence of {tokens_per_sequence:.0f} tokens ({hardware.kv_bytes_per_token} bytes a token); "
            "raise the utilisation or use a profile with more GPUs per engine"
        )
    return sequences


def zero_step_extra_s(
    hardware: Hardware, cluster: Cluster, zero_stage: int, link_bytes_per_s: float
) -> float:
    """What a step costs more (or less, below 0) under ``zero_stage`` than under the stage the profile's
    step figures are for: ZeRO-3 gathers the bf16 weights once more a step than stages 0-2."""
    if cluster.trainer_gpus == 1:
        return 0.0
    gathered = (
        WEIGHT_BYTES * hardware.model_params_b * 1e9 * (cluster.trainer_gpus - 1) / cluster.trainer_gpus
    )
    extra = (zero_stage == 3) - (hardware.zero_stage == 3)
    return extra * gathered / link_bytes_per_s


def engines_on(hardware: Hardware, cluster: Cluster) -> int:
    return cluster.actor_gpus // hardware.gpus_per_engine


def scaled_costs(costs: CostModel, hardware: Hardware, cluster: Cluster) -> CostModel:
    """The profile's costs on ``cluster``'s trainer GPUs (the module's docstring says how)."""
    share = hardware.trainer_gpus / cluster.trainer_gpus
    return replace(
        costs,
        train_per_token_s=costs.train_per_token_s * share,
        train_per_sequence_s=costs.train_per_sequence_s * share,
    )
