"""``pipelinerl doctor --config``: a config against this machine, or against stand-in facts (GPUs this
machine lacks), each FAIL naming the value and the setting to change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipelinerl.doctor import config_fit, machine, memory_need, model_facts
from pipelinerl.doctor.checks import Check
from pipelinerl.platform.config import ConfigError, PipelineConfig, load_config

GIB = 2**30
LLAMA_7B = model_facts.ModelFacts(
    "stand-in", "LlamaForCausalLM", memory_need.ModelShape(7_000_000_000, 32, 32, 128)
)
NO_GPU: dict[str, Any] = {"version": "2.13.0+cpu", "cuda": None, "cuda_available": False, "devices": []}
# Llama-style: vocab 100, hidden 16 (4 heads of 4, 2 KV heads), MLP 32, 2 layers. Parameters by hand:
# embeddings 100x16 = 1600; a layer: q 16x16 + k 16x8 + v 16x8 + o 16x16 + MLP 3x16x32 + 2 norms x16
# = 256+128+128+256+1536+32 = 2336, two of them 4672; final norm 16: 6288 tied, 7888 with its own head.
SMALL_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
}


def config(tmp_path: Path, *overrides: str) -> PipelineConfig:
    return load_config(
        None, [f"run.home={tmp_path / 'home'}", f"run.output_dir={tmp_path / 'runs'}", *overrides]
    )


def gpu_facts(count: int, memory_gib: float) -> dict[str, Any]:
    """torch's facts on a machine with ``count`` GPUs of ``memory_gib`` each."""
    devices = [
        {"index": i, "name": "H100", "memory_gib": memory_gib, "capability": [9, 0]} for i in range(count)
    ]
    return {"version": "2.13.0+cu124", "cuda": "12.4", "cuda_available": True, "devices": devices}


def smi_facts(count: int, memory_gib: float) -> dict[str, Any]:
    gpus = [{"index": str(i), "name": "H100", "memory_gib": memory_gib} for i in range(count)]
    return {"path": "nvidia-smi", "driver": "550", "cuda": "12.4", "gpus": gpus}


def checks(
    cfg: PipelineConfig,
    model: model_facts.ModelFacts | BaseException = LLAMA_7B,
    gpus: int = 0,
    gpu_gib: float = 80.0,
    available_gib: float = 64.0,
) -> dict[str, Check]:
    torch = gpu_facts(gpus, gpu_gib) if gpus else NO_GPU
    smi = smi_facts(gpus, gpu_gib) if gpus else None
    found = config_fit.config_checks(cfg, model, torch, smi, environ={}, available=available_gib * GIB)
    assert all(check.section == config_fit.SECTION for check in found)
    return {check.name: check for check in found}


def test_the_default_config_passes_on_this_machine(tmp_path: Path) -> None:
    """The real machine (no GPU here) and the embedded model: every config check passes."""
    cfg = config(tmp_path)
    model = model_facts.model_facts(cfg)
    assert model.source == "the embedded tiny model" and model.shape.layers == 4
    found = config_fit.config_checks(cfg, model, machine.torch_facts(), machine.nvidia_smi_facts())
    assert {check.name: check.status for check in found} == dict.fromkeys(
        ("model", "GPUs per role", "memory per role", "memory fit"), "PASS"
    )
    by_name = {check.name: check for check in found}
    if not machine.torch_facts()["devices"]:
        assert by_name["GPUs per role"].detail.startswith("CPU only: trainer and 1 actor(s) on CPU")
        assert "float32" in by_name["memory per role"].detail


def test_a_cuda_trainer_on_this_machine_fails_naming_the_setting(tmp_path: Path) -> None:
    if machine.torch_facts()["devices"]:
        pytest.skip("this machine has a GPU")
    found = checks(config(tmp_path, "trainer.device=cuda"))
    gpus = found["GPUs per role"]
    assert gpus.status == "FAIL" and "trainer.device='cuda'" in gpus.detail and "no GPU" in gpus.detail
    assert "trainer.device='auto' or 'cpu' (valid: auto, cpu, cuda)" in gpus.fix
    assert found["memory fit"].status == "SKIP"


def test_more_gpus_than_the_machine_shows_fails(tmp_path: Path) -> None:
    cfg = config(tmp_path, "trainer.num_processes=8", "actor.engine='vllm'")
    gpus = checks(cfg, gpus=8)["GPUs per role"]
    assert gpus.status == "FAIL"
    assert "needs 9 GPU(s): trainer.num_processes=8 on cuda + actor.num_actors=1" in gpus.detail
    assert "this machine shows 8" in gpus.detail
    assert "need at most 8" in gpus.fix and "cluster.colocate=true" in gpus.fix


def test_a_7b_model_under_zero2_over_8_ranks_and_a_vllm_actor_fits_9_gpus(tmp_path: Path) -> None:
    cfg = config(tmp_path, "trainer.num_processes=8", "actor.engine='vllm'")
    found = checks(cfg, gpus=9)
    assert found["GPUs per role"].status == "PASS"
    assert "trainer on GPU(s) 0,1,2,3,4,5,6,7, actors on GPU(s) 8" in found["GPUs per role"].detail
    roles = found["memory per role"]
    assert roles.status == "PASS"
    assert roles.data["trainer_rank"]["device_bytes"] == 26.25e9  # bf16 on cuda, ZeRO-2 over 8
    assert roles.data["actor"]["kv_reserved"] == 0.9 * 80 * GIB - 14e9
    fit = found["memory fit"]
    assert fit.status == "PASS"
    assert fit.data["gpus"]["0"]["need_bytes"] == 26.25e9 * 1.25 + GIB
    assert fit.data["gpus"]["8"]["need_bytes"] == 0.9 * 80 * GIB  # vLLM's share of its GPU
    assert "9 GPUs fit, the fullest: GPU 8 needs 72.0 GiB, has 80.0 GiB (actor 0)" in fit.detail


def test_a_7b_trainer_rank_too_large_for_its_gpu_fails_naming_the_gpu(tmp_path: Path) -> None:
    found = checks(config(tmp_path, "trainer.zero_stage=0"), gpus=1, gpu_gib=40)
    fit = found["memory fit"]
    assert fit.status == "FAIL"  # 16 bytes a parameter: 112e9 bytes, 130 GiB with the margin
    assert "GPU 0 needs 131.4 GiB, has 40.0 GiB (trainer rank 0)" in fit.detail
    for setting in ("trainer.zero_stage", "trainer.offload_optimizer", "model.dtype", "actor.kv_cache_gib"):
        assert setting in fit.fix


def test_vllms_share_of_a_small_gpu_that_cannot_hold_the_weights_fails(tmp_path: Path) -> None:
    cfg = config(tmp_path, "actor.engine='vllm'", "trainer.device=cpu", "actor.gpu_memory_utilization=0.5")
    found = checks(cfg, gpus=1, gpu_gib=24)
    assert found["memory per role"].status == "FAIL"  # no room left for a cache
    assert "holds 0 of H=32" in found["memory per role"].detail
    fit = found["memory fit"]
    assert fit.status == "FAIL"
    assert (
        "actor.gpu_memory_utilization=0.5 of GPU 0 (12.0 GiB) cannot hold the actor's weights" in fit.detail
    )


def test_a_host_too_small_for_the_cpu_roles_fails(tmp_path: Path) -> None:
    found = checks(config(tmp_path), available_gib=64)  # a 7B fp32 trainer rank on CPU: 112e9 bytes
    fit = found["memory fit"]
    assert fit.status == "FAIL" and "of 64.0 GiB available" in fit.detail
    assert "free host memory" in fit.fix and "trainer.offload_optimizer" in fit.fix


def test_a_vllm_cache_short_of_h_full_sequences_warns(tmp_path: Path) -> None:
    cfg = config(tmp_path, "actor.engine='vllm'", "actor.kv_cache_gib=1", "actor.max_in_flight=64")
    roles = checks(cfg)["memory per role"]  # vLLM on CPU, fp32: 1 MiB a token, 136 tokens a sequence
    assert roles.status == "WARN"
    assert "holds 7 of H=64 full sequences" in roles.detail
    assert "lower actor.max_in_flight to 7" in roles.fix and "raise actor.kv_cache_gib to 8.50" in roles.fix


def test_a_transformers_cache_below_one_sequence_fails(tmp_path: Path) -> None:
    cfg = config(tmp_path, "actor.kv_cache_blocks=2")
    roles = checks(cfg)["memory per role"]
    assert roles.status == "FAIL" and "holds 0 of H=32" in roles.detail
    assert "actor.kv_cache_blocks to 161 or 0" in roles.fix


def test_colocation_with_a_cpu_trainer_fails_as_the_launcher_would(tmp_path: Path) -> None:
    cfg = config(tmp_path, "actor.engine='vllm'", "cluster.colocate=true", "actor.gpu_memory_utilization=0.3")
    gpus = checks(cfg)["GPUs per role"]
    assert gpus.status == "FAIL" and "set cluster.colocate=false" in gpus.detail
    shared = checks(cfg, gpus=1)
    assert (
        shared["GPUs per role"].status == "PASS"
        and "shares trainer rank 0's GPU" in shared["GPUs per role"].detail
    )
    assert shared["memory fit"].data["gpus"]["0"]["roles"] == "trainer rank 0, actor 0"


def test_pools_check_gpus_per_node(tmp_path: Path) -> None:
    cfg = config(tmp_path, "cluster.placement='pools'", "trainer.device=cuda", "trainer.num_processes=2")
    gpus = checks(cfg)["GPUs per role"]
    assert gpus.status == "FAIL" and "cluster.trainer_gpus_per_node to 2" in gpus.fix
    fine = checks(config(tmp_path, "cluster.placement='pools'"))
    assert fine["GPUs per role"].status == "SKIP"
    assert "each node checks its own GPUs" in fine["GPUs per role"].detail
    assert fine["memory fit"].status == "SKIP"


def test_a_hub_id_not_in_the_cache_fails_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg = config(tmp_path, "model.path='someorg/some-model'")
    with pytest.raises(ConfigError) as raised:
        model_facts.model_facts(cfg)
    found = checks(cfg, raised.value)
    model = found["model"]
    assert model.status == "FAIL"
    assert "someorg/some-model is not in the Hugging Face cache" in model.detail
    assert "hf download someorg/some-model" in model.detail
    assert found["memory per role"].status == found["memory fit"].status == "SKIP"


def write_snapshot(cache: Path, repo_id: str, settings: dict[str, Any]) -> Path:
    """A Hugging Face cache holding ``repo_id``'s main revision with this config.json."""
    commit = "a" * 40
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(settings))
    return snapshot


def test_a_cached_hub_id_and_a_local_directory_count_parameters_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    write_snapshot(tmp_path / "hub", "someorg/small", SMALL_LLAMA)
    cached = model_facts.model_facts(config(tmp_path, "model.path='someorg/small'"))
    assert cached.shape == memory_need.ModelShape(params=6288, layers=2, kv_heads=2, head_dim=4)
    assert cached.source.startswith("someorg/small (cached snapshot aaaa")
    local = tmp_path / "local"
    local.mkdir()
    (local / "config.json").write_text(json.dumps({**SMALL_LLAMA, "tie_word_embeddings": False}))
    untied = model_facts.model_facts(config(tmp_path, f"model.path='{local}'"))
    assert untied.shape.params == 7888 and untied.source == str(local)
    assert checks(config(tmp_path), untied)["model"].status == "PASS"


def test_an_unreadable_model_config_fails() -> None:
    model = config_fit.check_model(ValueError("Unrecognized model in /x"))
    assert model.status == "FAIL" and "cannot read the model's config" in model.detail
    assert "model.path" in model.fix
