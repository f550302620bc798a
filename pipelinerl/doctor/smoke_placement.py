"""Where ``doctor --smoke`` puts its 3-step run, by the GPUs this machine has. Pure.

The smoke run is the user's config (model, task, transport, tracking) with only what makes it short
and what places it on this machine's devices changed:

* no GPU: the config as it is (today's default: trainer and transformers actor on CPU, gloo);
* one GPU: the trainer on it, one vLLM actor colocated with it in bf16 with CUDA graphs, updates as
  CUDA IPC handles (``cluster.colocate``; vLLM's share of the GPU lowered to leave the trainer room);
* two or more: the trainer on the first GPU, one vLLM actor on the next, updates over NCCL.
"""

from __future__ import annotations

from typing import Any

SMOKE_STEPS = 3
# The held-out success the launcher measures before and after: a few problems keep it to seconds.
SMOKE_EVAL_PROBLEMS = 8
COLOCATED_GPU_SHARE = 0.3  # vLLM's share of a GPU it shares with the trainer (the config allows <= 0.6)

SHORT: dict[str, Any] = {
    "run.max_steps": SMOKE_STEPS,
    "run.max_restarts": 0,
    "run.plan_profile": None,
    "eval.every": 0,
    "task.eval_problems": SMOKE_EVAL_PROBLEMS,
}


def smoke_overrides(gpus: int) -> dict[str, Any]:
    """The settings that make a config a smoke run on a machine with ``gpus`` GPUs."""
    if gpus < 0:
        raise ValueError(f"gpus must be 0 or more, not {gpus}")
    if gpus == 0:
        return dict(SHORT)
    on_gpu = {
        **SHORT,
        "cluster.placement": "local",
        "trainer.device": "cuda",
        "trainer.num_processes": 1,
        "actor.engine": "vllm",
        "actor.num_actors": 1,
        "actor.tensor_parallel_size": 1,
        "actor.cuda_graphs": "on",
        "model.dtype": "bfloat16",
    }
    if gpus == 1:
        return on_gpu | {
            "cluster.colocate": True,
            "transport.weight_backend": "ipc",
            "actor.gpu_memory_utilization": COLOCATED_GPU_SHARE,
        }
    return on_gpu | {"cluster.colocate": False, "transport.weight_backend": "nccl"}


def placement_label(gpus: int) -> str:
    """The placement in words, for the report."""
    if gpus == 0:
        return "CPU: the config's own placement (no GPU here)"
    if gpus == 1:
        return (
            "1 GPU: trainer on cuda:0, a vLLM actor colocated in bf16 with CUDA graphs, updates by CUDA IPC"
        )
    return "2+ GPUs: trainer on cuda:0, a vLLM actor on cuda:1 in bf16 with CUDA graphs, updates over NCCL"
