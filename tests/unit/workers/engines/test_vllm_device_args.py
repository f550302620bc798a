"""The vLLM engine's arguments per device (pure; the engine itself is tested in .venv-vllm): the CPU
build's block size, cache and eager execution, unchanged; on a GPU, vLLM's own defaults, the cache by
gpu_memory_utilization unless a size is given, CUDA graphs unless turned off."""

from __future__ import annotations

import pytest

from pipelinerl.platform.config import load_config
from pipelinerl.workers.engines.vllm_engine import device_engine_args


def args(on_cpu: bool, **settings):
    defaults = dict(max_model_len=128, kv_cache_gib=None, gpu_memory_utilization=0.9, cuda_graphs="auto")
    return device_engine_args(on_cpu=on_cpu, **{**defaults, **settings})


def test_on_cpu_what_the_cpu_build_needs():
    assert args(True) == {
        "block_size": 32,
        "max_num_batched_tokens": 2048,
        "kv_cache_memory_bytes": 2**30,
        "enforce_eager": True,
    }
    assert args(True, kv_cache_gib=0.5, max_model_len=4096)["kv_cache_memory_bytes"] == 2**29
    assert args(True, max_model_len=4096)["max_num_batched_tokens"] == 4096
    assert args(True, cuda_graphs="off")["enforce_eager"] is True
    with pytest.raises(ValueError, match="needs a GPU"):
        args(True, cuda_graphs="on")


def test_on_a_gpu_vllm_defaults_cuda_graphs_and_the_cache_by_utilization():
    assert args(False) == {"gpu_memory_utilization": 0.9, "enforce_eager": False}
    assert args(False, gpu_memory_utilization=0.35)["gpu_memory_utilization"] == 0.35
    assert args(False, kv_cache_gib=24) == {"kv_cache_memory_bytes": 24 * 2**30, "enforce_eager": False}
    assert args(False, cuda_graphs="off")["enforce_eager"] is True
    with pytest.raises(ValueError, match="expected 'auto', 'on' or 'off'"):
        args(False, cuda_graphs="yes")


def test_the_config_carries_the_settings_and_refuses_a_bad_one():
    config = load_config(None, ["actor.gpu_memory_utilization=0.4", "actor.cuda_graphs=off"])
    assert (config.actor.gpu_memory_utilization, config.actor.cuda_graphs, config.actor.kv_cache_gib) == (
        0.4,
        "off",
        None,
    )
    for bad in ("actor.gpu_memory_utilization=1.5", "actor.cuda_graphs=sometimes", "actor.kv_cache_gib=0"):
        with pytest.raises(ValueError, match=bad.split("=")[0]):
            load_config(None, [bad])
