"""The actor's generation engine, built from the run's config: transformers' continuous batching
in the actor's own process, or vLLM's async engine whose workers join the trainer's weight group."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from pipelinerl.platform.checkpoint import starting_version
from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.dtypes import policy_dtype, policy_dtype_name
from pipelinerl.workers.engines.lm_head import float32_lm_head
from pipelinerl.workers.engines.protocol import Engine, WorkersEngine
from pipelinerl.workers.engines.vllm_engine import VLLMEngine, WeightGroupAddress


def engine_seed(config: PipelineConfig, actor_id: int) -> int:
    """Each actor samples from a seed of its own, fixed by the run's seed."""
    return config.run.seed * 1000 + actor_id


def transformers_engine(
    config: PipelineConfig,
    actor_id: int,
    eos_token_ids: Sequence[int],
    model_path: Path,
    max_prompt_tokens: int,
) -> Engine[torch.nn.Module]:
    from pipelinerl.workers.engines.transformers_engine import TransformersEngine  # noqa: PLC0415 (transformers>=5.20, absent from vLLM's env)

    actor = config.actor
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=policy_dtype(config.model.dtype))
    if config.model.lm_head_fp32:
        float32_lm_head(model)
    return TransformersEngine(
        model,
        eos_token_id=eos_token_ids,
        max_in_flight=actor.max_in_flight,
        max_new_tokens=actor.max_new_tokens,
        max_prompt_tokens=max_prompt_tokens,
        temperature=actor.temperature,
        kv_block_size=actor.kv_block_size,
        kv_cache_blocks=actor.kv_cache_blocks,
        seed=engine_seed(config, actor_id),
        policy_version=starting_version(config.run.resume_from),
    )


def vllm_engine(
    config: PipelineConfig,
    actor_id: int,
    eos_token_ids: Sequence[int],
    model_path: Path,
    max_prompt_tokens: int,
) -> WorkersEngine:
    if importlib.util.find_spec("vllm") is None:
        raise SystemExit(
            "actor.engine='vllm' needs vLLM in the actor's interpreter (no module named 'vllm'); build "
            ".venv-vllm with `make vllm-env` and set actor.python=.venv-vllm/bin/python"
        )
    actor, transport = config.actor, config.transport
    return VLLMEngine(
        model_path,
        eos_token_id=eos_token_ids,
        max_in_flight=actor.max_in_flight,
        max_new_tokens=actor.max_new_tokens,
        max_prompt_tokens=max_prompt_tokens,
        temperature=actor.temperature,
        seed=engine_seed(config, actor_id),
        policy_version=starting_version(config.run.resume_from),
        kv_cache_on_update=actor.kv_cache_on_update,
        kv_cache_gib=actor.kv_cache_gib,
        gpu_memory_utilization=actor.gpu_memory_utilization,
        cuda_graphs=actor.cuda_graphs,
        lm_head_fp32=config.model.lm_head_fp32,
        dtype=policy_dtype_name(config.model.dtype),
        cpu_threads=actor.torch_threads,
        tensor_parallel_size=actor.tensor_parallel_size,
        weight_group=WeightGroupAddress(
            transport.host,
            transport.port("weight_group"),
            config.actor_first_weight_rank(actor_id),
            config.weight_group_size(),
        ),
    )
