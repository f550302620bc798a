"""The doctor's memory and GPU arithmetic against figures computed by hand."""

from __future__ import annotations

import pytest

from pipelinerl.doctor import memory_need as need

GIB = 2**30
SEVEN_B = 7_000_000_000
# Llama-2-7B's attention: 32 layers, 32 KV heads of 128.
LLAMA_7B = need.ModelShape(params=SEVEN_B, layers=32, kv_heads=32, head_dim=128)


def test_a_7b_bf16_rank_under_zero2_over_8_ranks() -> None:
    rank = need.trainer_rank_need(SEVEN_B, "bfloat16", ranks=8, zero_stage=2, offload_optimizer=False)
    assert rank.weights == 14e9  # 2 bytes each, whole on every rank
    assert rank.grads == 14e9 / 8  # 1.75e9: sharded from stage 2
    assert rank.optimizer == 12 * SEVEN_B / 8  # Adam's 2 fp32 moments + fp32 master: 12 bytes, sharded
    assert rank.device == 14e9 + 1.75e9 + 10.5e9 == 26.25e9
    assert rank.host == 0.0


def test_zero3_shards_the_weights_too_and_offload_moves_the_optimizer_to_the_host() -> None:
    rank = need.trainer_rank_need(SEVEN_B, "bfloat16", ranks=8, zero_stage=3, offload_optimizer=True)
    assert (rank.weights, rank.grads) == (1.75e9, 1.75e9)
    assert rank.device == 3.5e9 and rank.host == 10.5e9 and rank.total == 14e9


def test_fp32_keeps_no_master_copy_and_zero0_shards_nothing() -> None:
    rank = need.trainer_rank_need(1000, "float32", ranks=4, zero_stage=0, offload_optimizer=False)
    assert (rank.weights, rank.grads, rank.optimizer) == (4000, 4000, 8000)  # 16 bytes a parameter
    stage1 = need.trainer_rank_need(1000, "float32", ranks=4, zero_stage=1, offload_optimizer=False)
    assert (stage1.weights, stage1.grads, stage1.optimizer) == (4000, 4000, 2000)


def test_the_kv_cache_of_h_full_sequences() -> None:
    assert LLAMA_7B.kv_bytes_per_token("bfloat16") == 2 * 32 * 32 * 128 * 2 == 524_288  # 0.5 MiB
    actor = need.actor_need(LLAMA_7B, "bfloat16", max_in_flight=32, sequence_tokens=136, kv_reserved=GIB)
    assert actor.weights == 14e9
    assert actor.kv_full == 32 * 136 * 524_288 == 2.125 * GIB
    assert actor.sequences_held == 15  # 1 GiB / (136 x 0.5 MiB) = 15.06
    assert actor.total == 14e9 + GIB
    unknown = need.actor_need(LLAMA_7B, "bfloat16", 32, 136, kv_reserved=None)
    assert unknown.sequences_held is None and unknown.total == 14e9 + 2.125 * GIB


def test_what_a_vllm_actor_reserves() -> None:
    common = {"cpu_default_gib": 1.0, "gpu_memory_utilization": 0.9, "gpu_memory": 80 * GIB, "weights": 14e9}
    on_gpu = need.vllm_cache_bytes(kv_cache_gib=None, on_gpu=True, tensor_parallel_size=1, **common)
    assert on_gpu == 72 * GIB - 14e9
    tp2 = need.vllm_cache_bytes(kv_cache_gib=None, on_gpu=True, tensor_parallel_size=2, **common)
    assert tp2 == 144 * GIB - 14e9
    assert need.vllm_cache_bytes(kv_cache_gib=4, on_gpu=True, tensor_parallel_size=2, **common) == 8 * GIB
    assert need.vllm_cache_bytes(kv_cache_gib=None, on_gpu=False, tensor_parallel_size=1, **common) == GIB
    assert need.vllm_cache_bytes(kv_cache_gib=3, on_gpu=False, tensor_parallel_size=1, **common) == 3 * GIB
    small = {**common, "gpu_memory": 12 * GIB}  # 0.9 x 12 GiB = 11.6e9 bytes < 14e9 of weights
    assert need.vllm_cache_bytes(kv_cache_gib=None, on_gpu=True, tensor_parallel_size=1, **small) == 0.0


def test_the_transformers_engines_blocks() -> None:
    # 0: room for H full sequences (ceil(136 / 32) = 5 blocks each) and one block more.
    assert need.transformers_cache_blocks(0, 32, max_in_flight=32, sequence_tokens=136) == 161
    assert need.transformers_cache_blocks(10, 32, max_in_flight=32, sequence_tokens=136) == 10


def test_gpus_per_role() -> None:
    args = {"ranks": 2, "num_actors": 3, "tp": 2}
    assert need.gpu_need(trainer_on_cuda=True, actors_on_gpu=True, colocate=False, **args).total == 8
    cpu_trainer = need.gpu_need(trainer_on_cuda=False, actors_on_gpu=True, colocate=False, **args)
    assert (cpu_trainer.trainer, cpu_trainer.actors) == (0, 6)
    colocated = need.gpu_need(
        trainer_on_cuda=True, actors_on_gpu=True, colocate=True, ranks=1, num_actors=1, tp=1
    )
    assert (colocated.trainer, colocated.actors) == (1, 0)
    assert need.gpu_need(trainer_on_cuda=False, actors_on_gpu=False, colocate=False, **args).total == 0


@pytest.mark.parametrize(
    ("need_gib", "status"), [(7.9, "PASS"), (8.1, "WARN"), (10.0, "WARN"), (10.1, "FAIL")]
)
def test_fit_against_10_gib_of_room(need_gib: float, status: str) -> None:
    assert need.fit(need_gib * GIB, 10 * GIB) == status
    assert need.fit(9.4 * GIB, 10 * GIB, need.GPU_WARN_SHARE) == "PASS"


def test_the_margin_and_sizes() -> None:
    assert need.with_margin(4 * GIB) == 6 * GIB  # 4 x 1.25 + 1 GiB
    assert need.size(4.1 * 2**20) == "4.1 MiB"
    assert need.size(1.5 * GIB) == "1.50 GiB"
    assert need.size(26.25e9) == "24.4 GiB"


def test_a_kl_reference_is_a_whole_copy_on_every_rank() -> None:
    plain = need.trainer_rank_need(7_000_000_000, "bfloat16", 8, 3, False)
    with_kl = need.trainer_rank_need(7_000_000_000, "bfloat16", 8, 3, False, reference_model=True)
    assert with_kl.reference == 14e9, "7B parameters x 2 bytes, not sharded by ZeRO-3"
    assert with_kl.device - plain.device == 14e9 and plain.reference == 0.0
