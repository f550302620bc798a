"""How weight updates would travel: NCCL between every pair of GPUs in rounds of disjoint pairs, the
backend ``transport.weight_backend`` resolves to here, and the CUDA IPC hand-over. On this machine
without a GPU the GPU paths are driven for real into their FAIL lines (the workers find no CUDA)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from pipelinerl.doctor import collectives, weight_paths
from pipelinerl.platform.config import PipelineConfig, load_config


def config(tmp_path: Path, *overrides: str) -> PipelineConfig:
    return load_config(None, [f"run.home={tmp_path / 'home'}", *overrides])


@pytest.mark.parametrize("count", [2, 3, 4, 5, 8])
def test_every_pair_once_in_rounds_of_disjoint_pairs(count: int) -> None:
    rounds = collectives.pair_rounds(count)
    pairs = [pair for round_ in rounds for pair in round_]
    assert sorted(pairs) == list(itertools.combinations(range(count), 2))
    for round_ in rounds:
        members = [gpu for pair in round_ for gpu in pair]
        assert len(members) == len(set(members)), f"a GPU twice in one round: {round_}"
    assert len(rounds) == (count - 1 if count % 2 == 0 else count)


def test_children_see_the_gpus_by_the_parents_names() -> None:
    assert collectives.visible_ids(2, {"CUDA_VISIBLE_DEVICES": "3,5"}) == ["3", "5"]
    assert collectives.visible_ids(2, {}) == ["0", "1"]


def answer(mb_s: float, ok: bool = True) -> dict:
    return {"ok": ok, "megabytes": 4.19, "all_reduce_mb_s": mb_s, "broadcast_mb_s": mb_s}


def test_the_slowest_pair_is_named_and_failed_pairs_fail() -> None:
    good = collectives.pair_verdict(
        {(0, 1): answer(9000.0), (0, 2): answer(800.0), (1, 2): answer(9100.0)}, "fix"
    )
    assert (
        good.status == "PASS"
        and "slowest GPUs 0-2 800 MB/s" in good.detail
        and good.name.endswith("3 GPU pair(s)")
    )
    bad = collectives.pair_verdict(
        {(0, 1): answer(9000.0), (0, 2): {"error": "rank 1 failed: NCCL error"}}, "fix"
    )
    assert bad.status == "FAIL" and "1 of 2 pairs failed: GPUs 0-2: rank 1 failed: NCCL error" in bad.detail


def test_nccl_on_a_machine_without_cuda_fails_naming_the_pair(tmp_path: Path) -> None:
    check = collectives.check_nccl(config(tmp_path), 2)  # real workers: they find no CUDA device
    assert check.status == "FAIL" and "GPUs 0-1" in check.detail and "NCCL_DEBUG=INFO" in check.fix


def test_the_backend_auto_picks_here_and_where_it_is_measured(tmp_path: Path) -> None:
    cpu = weight_paths.check_weight_backend(config(tmp_path), [], False)
    assert cpu.status == "PASS" and cpu.data["backend"] == "gloo" and "gloo, 2 CPU processes" in cpu.detail
    vllm = config(tmp_path, "actor.engine=vllm")
    assert weight_paths.check_weight_backend(vllm, ["0", "1"], True).data["backend"] == "nccl"
    colocated = config(
        tmp_path, "actor.engine=vllm", "cluster.colocate=true", "actor.gpu_memory_utilization=0.3"
    )
    assert weight_paths.check_weight_backend(colocated, ["0"], True).data["backend"] == "ipc"


def test_a_backend_a_run_would_refuse_fails_naming_it(tmp_path: Path) -> None:
    nccl = config(tmp_path, "actor.engine=vllm", "transport.weight_backend=nccl")
    check = weight_paths.check_weight_backend(nccl, [], False)  # no GPU: the trainer resolves to cpu
    assert check.status == "FAIL" and "weight_backend='nccl'" in check.detail and "auto" in check.fix


def test_cuda_ipc_is_skipped_where_colocation_is_not_used(tmp_path: Path) -> None:
    assert weight_paths.check_cuda_ipc(config(tmp_path), 0).status == "SKIP"
    two = weight_paths.check_cuda_ipc(config(tmp_path), 2)
    assert two.status == "SKIP" and "NCCL" in two.detail


def test_a_cuda_ipc_handover_that_cannot_happen_fails_naming_the_side(tmp_path: Path) -> None:
    check = weight_paths.check_cuda_ipc(config(tmp_path), 1)  # real processes: no CUDA to export from
    assert (
        check.status == "FAIL"
        and "the exporting process failed" in check.detail
        and "--ipc=host" in check.fix
    )
