"""The trainer's DeepSpeed engine, set up: its settings from the run's config, activation checkpointing,
and the ranks' process group (``workers/trainer.py`` builds the engine with them; a replay's ranks too)."""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.stores import init_trainer_group


def deepspeed_config(config: PipelineConfig, bf16: bool = False) -> dict[str, Any]:
    """DeepSpeed's settings for this run; ``bf16``: the model's weights are bfloat16 (``model.dtype``),
    and DeepSpeed keeps float32 master weights for the optimizer."""
    trainer = config.trainer
    ds_config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        # The number of micro-batches varies per step (packing), so step() is the boundary.
        "managed_gradient_accumulation": False,
        "gradient_clipping": trainer.grad_clip,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": trainer.learning_rate, "weight_decay": trainer.weight_decay, "torch_adam": True},
        },
        "zero_optimization": {"stage": trainer.zero_stage},
        "steps_per_print": 10**9,
    }
    if trainer.offload_optimizer:
        ds_config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if bf16:
        ds_config["bf16"] = {"enabled": True}
    if trainer.warmup_steps:
        ds_config["scheduler"] = {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": trainer.learning_rate,
                "warmup_num_steps": trainer.warmup_steps,
                "warmup_type": "linear",
            },
        }
    return ds_config


def enable_activation_checkpointing(model: Any) -> None:
    """Recompute each layer's activations in the backward pass (``trainer.activation_checkpointing``);
    transformers 5.21 renamed gradient checkpointing to activation checkpointing."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def init_distributed(deepspeed: Any, config: PipelineConfig, rank: int, backend: str) -> None:
    """The ranks' default process group, then DeepSpeed's communication on it.

    The rendezvous store listens on ``MASTER_ADDR`` (``transport.host``) only, and gloo on its
    interface (``stores.init_trainer_group``): ``env://`` would have rank 0's store listen on every
    interface, unauthenticated. DeepSpeed finds the group initialised and uses it. Under torchrun the
    agent serves the rendezvous (``TORCHELASTIC_USE_AGENT_STORE``): DeepSpeed joins it as before.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        init_trainer_group(
            backend,
            os.environ.get("MASTER_ADDR", config.transport.host),
            int(os.environ.get("MASTER_PORT", config.transport.port("trainer_dist"))),
            rank,
            config.trainer.num_processes,
            default_pg_timeout,  # torch's and DeepSpeed's default for a group's collectives
        )
    deepspeed.init_distributed(dist_backend=backend)


def leave_distributed() -> None:
    """Every rank leaves the process group together, before the process exits: a barrier, then the group
    destroyed. A rank whose interpreter exits with the group still up tears gloo's threads down while its
    peers may still use the pairs, and can abort ("terminate called without an active exception", exit
    -6: a replay's rank 0 after its last step, once in a clean run)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
