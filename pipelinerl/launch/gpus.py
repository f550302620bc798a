"""Which GPUs each actor process of a node sees (``CUDA_VISIBLE_DEVICES``), decided before any starts.

A vLLM engine takes the first GPUs it sees, so actor processes sharing a node must each be shown
their own: actor ``k`` of the node gets ``actor.tensor_parallel_size`` GPUs of its own, in order,
from the GPUs the node's job may use (its own ``CUDA_VISIBLE_DEVICES``, else every GPU
``nvidia-smi`` lists). A node without GPUs (the CPU build, the transformers engine) gets no
assignment: its actors see what the launcher sees.

``plan_actor_gpus`` is pure; ``visible_gpus`` reads the environment. Both fail, naming the settings
and what this node has, when the actors of a node need more GPUs than it has.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Literal

from pipelinerl.platform.config import ConfigError


class GpuPlanError(ConfigError):
    """The actors of a node need more GPUs than it has; the message names the settings and the GPUs."""


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """The GPU ids this process may hand out: ``CUDA_VISIBLE_DEVICES`` when set (an empty value
    hides every GPU), else the indices of the GPUs ``nvidia-smi -L`` lists, else none."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [part.strip() for part in environ["CUDA_VISIBLE_DEVICES"].split(",") if part.strip()]
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return []
    try:
        listing = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(index) for index, line in enumerate(listing.stdout.splitlines()) if line.startswith("GPU ")]


def torch_sees_cuda() -> bool:
    """Whether this environment's torch can use a GPU (a CPU build on a GPU node cannot)."""
    import torch  # noqa: PLC0415 (torch: after preflight, not on the launcher's import)

    return bool(torch.cuda.is_available())


def trainer_device(setting: str, gpus: Sequence[str], torch_cuda: bool) -> Literal["cpu", "cuda"]:
    """``trainer.device`` resolved on a node with ``gpus`` whose torch can (``torch_cuda``) use them."""
    if setting == "cpu":
        return "cpu"
    if setting == "auto":
        return "cuda" if gpus and torch_cuda else "cpu"
    if setting != "cuda":
        raise ValueError(f"trainer.device {setting!r} is not one of auto, cpu, cuda")
    if not gpus:
        raise GpuPlanError(
            "trainer.device='cuda' but this node has no GPU (CUDA_VISIBLE_DEVICES is empty or unset and "
            "nvidia-smi lists none); use trainer.device='cpu', or 'auto' to take a GPU where there is one"
        )
    if not torch_cuda:
        raise GpuPlanError(
            f"trainer.device='cuda': this node has GPUs ({','.join(gpus)}) but this environment's torch "
            "cannot use them (a CPU build?); install a CUDA build of torch or use trainer.device='cpu'"
        )
    return "cuda"


def plan_trainer_gpus(ranks_on_node: int, gpus: Sequence[str]) -> list[str]:
    """The GPUs of the node's trainer ranks, one each, first in order (the actors take the rest)."""
    if ranks_on_node > len(gpus):
        raise GpuPlanError(
            f"{ranks_on_node} trainer rank(s) on this node need a GPU each with trainer.device on cuda; "
            f"this node has {len(gpus)} ({','.join(gpus) or 'none'}). Lower trainer.num_processes per node "
            "(or raise cluster.trainer_nodes), or use trainer.device='cpu'"
        )
    return list(gpus[:ranks_on_node])


def actor_gpu_pool(
    gpus: Sequence[str], trainer_gpus: Sequence[str], *, engine: str, colocate: bool
) -> list[str]:
    """The GPUs the node's actors are given theirs from: none for the transformers engine (it runs on
    CPU); with ``cluster.colocate``, the GPU of trainer rank 0, which the one actor shares; else the
    GPUs the trainer ranks left."""
    if engine != "vllm":
        return []
    if colocate:
        if not trainer_gpus:
            raise GpuPlanError(
                "cluster.colocate=true shares trainer rank 0's GPU with the actor, but the trainer runs on "
                f"CPU here (trainer.device resolved to cpu; this node's GPUs: {','.join(gpus) or 'none'}); "
                "set cluster.colocate=false, or run where a GPU and a CUDA build of torch are"
            )
        return list(trainer_gpus[:1])
    return list(gpus[len(trainer_gpus) :])


def plan_actor_gpus(
    actor_ids: Sequence[int], tensor_parallel_size: int, gpus: Sequence[str]
) -> dict[int, str]:
    """``CUDA_VISIBLE_DEVICES`` for each of the node's actors: ``tensor_parallel_size`` GPUs each, in
    order; ``{}`` when the node has no GPUs (its actors run on CPU)."""
    if tensor_parallel_size < 1:
        raise ValueError(f"actor.tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
    if not gpus or not actor_ids:
        return {}
    needed = len(actor_ids) * tensor_parallel_size
    if needed > len(gpus):
        raise GpuPlanError(
            f"{len(actor_ids)} actor(s) on this node x actor.tensor_parallel_size={tensor_parallel_size} "
            f"need {needed} GPUs; this node has {len(gpus)} ({','.join(gpus)}). Lower actor.num_actors per "
            "node (or raise cluster.actor_nodes) or actor.tensor_parallel_size, or give the node more GPUs"
        )
    return {
        actor_id: ",".join(gpus[slot * tensor_parallel_size : (slot + 1) * tensor_parallel_size])
        for slot, actor_id in enumerate(actor_ids)
    }
