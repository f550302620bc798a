"""Each actor process of a node sees its own GPUs; too few GPUs stop the run before any process starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pipelinerl.launch import stages as stages_module
from pipelinerl.launch.gpus import (
    GpuPlanError,
    actor_gpu_pool,
    plan_actor_gpus,
    plan_trainer_gpus,
    trainer_device,
    visible_gpus,
)
from pipelinerl.launch.stages import build_stages
from pipelinerl.platform.config import ConfigError, load_config


def test_each_actor_gets_its_own_block_of_tensor_parallel_gpus_in_order() -> None:
    assert plan_actor_gpus([0, 1], 1, ["0", "1", "2", "3"]) == {0: "0", 1: "1"}
    assert plan_actor_gpus([4, 5], 2, ["2", "3", "6", "7"]) == {4: "2,3", 5: "6,7"}


def test_a_node_without_gpus_assigns_nothing() -> None:
    assert plan_actor_gpus([0, 1, 2], 1, []) == {}
    assert plan_actor_gpus([], 2, ["0", "1"]) == {}


def test_more_gpus_asked_than_the_node_has_is_refused_naming_the_settings() -> None:
    with pytest.raises(
        GpuPlanError,
        match=r"3 actor\(s\) on this node x actor.tensor_parallel_size=2 need 6 GPUs; "
        r"this node has 4 \(0,1,2,3\)",
    ):
        plan_actor_gpus([0, 1, 2], 2, ["0", "1", "2", "3"])
    assert issubclass(GpuPlanError, ConfigError), "the CLI reports it as a bad setting"


def test_visible_gpus_follow_cuda_visible_devices_then_nvidia_smi(tmp_path: Path, monkeypatch) -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 5"}) == ["2", "5"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: a)'\necho 'GPU 1: NVIDIA H100 (UUID: b)'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert subprocess.run(["nvidia-smi", "-L"], capture_output=True, check=True).stdout
    assert visible_gpus({}) == ["0", "1"]
    monkeypatch.setenv("PATH", "/nonexistent")
    assert visible_gpus({}) == []


def test_vllm_actor_stages_carry_their_gpus(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    config = load_config(
        None,
        [
            "actor.engine=vllm",
            "actor.num_actors=2",
            "actor.tensor_parallel_size=2",
            "actor.python=/bin/python3",
        ],
    )
    stages = {stage.name: stage for stage in build_stages(config, tmp_path, tmp_path)}
    assert stages["actor0"].env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert stages["actor1"].env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert stages["trainer0"].env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3", (
        "the trainer's devices are not planned yet"
    )
    too_many = load_config(None, ["actor.engine=vllm", "actor.num_actors=3", "actor.tensor_parallel_size=2"])
    with pytest.raises(GpuPlanError, match="need 6 GPUs"):
        build_stages(too_many, tmp_path, tmp_path)


def test_transformers_actors_keep_the_launcher_s_devices(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    stages = build_stages(load_config(None, ["actor.num_actors=2"]), tmp_path, tmp_path)
    assert all(stage.env["CUDA_VISIBLE_DEVICES"] == "0" for stage in stages)


def test_pool_settings_that_cannot_fit_are_refused_by_the_config() -> None:
    base = ["actor.engine=vllm", "cluster.placement=pools", "run.output_dir=/shared/runs"]
    with pytest.raises(ConfigError, match="must divide cluster.actor_gpus_per_node=3"):
        load_config(None, [*base, "actor.tensor_parallel_size=2", "cluster.actor_gpus_per_node=3"])
    with pytest.raises(
        ConfigError, match=r"4 actor\(s\) per node .* need 4 GPUs per node; cluster.actor_gpus_per_node=2"
    ):
        load_config(None, [*base, "actor.num_actors=4", "cluster.actor_gpus_per_node=2"])
    load_config(None, [*base, "actor.num_actors=4", "cluster.actor_nodes=2", "cluster.actor_gpus_per_node=2"])


def test_the_trainer_device_resolves_from_the_setting_the_gpus_and_torch() -> None:
    assert trainer_device("auto", [], torch_cuda=False) == "cpu"
    assert trainer_device("auto", ["0"], torch_cuda=False) == "cpu", "a CPU build of torch on a GPU node"
    assert trainer_device("auto", ["0"], torch_cuda=True) == "cuda"
    assert trainer_device("cpu", ["0"], torch_cuda=True) == "cpu"
    assert trainer_device("cuda", ["0"], torch_cuda=True) == "cuda"
    with pytest.raises(GpuPlanError, match="trainer.device='cuda' but this node has no GPU"):
        trainer_device("cuda", [], torch_cuda=False)
    with pytest.raises(GpuPlanError, match="cannot use them"):
        trainer_device("cuda", ["0", "1"], torch_cuda=False)


def test_trainer_ranks_take_a_gpu_each_first() -> None:
    assert plan_trainer_gpus(2, ["4", "5", "6"]) == ["4", "5"]
    with pytest.raises(GpuPlanError, match=r"2 trainer rank\(s\) on this node need a GPU each"):
        plan_trainer_gpus(2, ["0"])


def test_on_a_gpu_node_the_trainer_takes_the_first_gpus_and_the_actors_the_next(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    monkeypatch.setattr(stages_module, "torch_sees_cuda", lambda: True)
    config = load_config(None, ["actor.engine=vllm", "actor.num_actors=2", "actor.python=/bin/python3"])
    stages = {stage.name: stage for stage in build_stages(config, tmp_path, tmp_path)}
    trainer = stages["trainer0"]
    assert trainer.env["CUDA_VISIBLE_DEVICES"] == "0" and trainer.env["DS_ACCELERATOR"] == "cuda"
    assert trainer.command[trainer.command.index("--device") + 1] == "cuda"
    assert (stages["actor0"].env["CUDA_VISIBLE_DEVICES"], stages["actor1"].env["CUDA_VISIBLE_DEVICES"]) == (
        "1",
        "2",
    )
    on_cpu = load_config(None, ["trainer.device=cpu", "actor.engine=vllm", "actor.python=/bin/python3"])
    cpu_stages = {stage.name: stage for stage in build_stages(on_cpu, tmp_path, tmp_path)}
    assert cpu_stages["trainer0"].env["DS_ACCELERATOR"] == "cpu"
    assert cpu_stages["actor0"].env["CUDA_VISIBLE_DEVICES"] == "0"


def test_trainer_device_cuda_on_a_machine_without_gpus_stops_before_any_process(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(GpuPlanError, match="no GPU"):
        build_stages(load_config(None, ["trainer.device=cuda"]), tmp_path, tmp_path)


def test_the_actors_take_their_gpus_from_what_the_trainer_left_or_share_its_gpu_colocated() -> None:
    assert actor_gpu_pool(["0", "1", "2"], ["0"], engine="vllm", colocate=False) == ["1", "2"]
    assert actor_gpu_pool(["0", "1", "2"], ["0"], engine="transformers", colocate=False) == []
    assert actor_gpu_pool(["3"], ["3"], engine="vllm", colocate=True) == ["3"]
    with pytest.raises(GpuPlanError, match=r"cluster.colocate=true .*trainer.device resolved to cpu"):
        actor_gpu_pool([], [], engine="vllm", colocate=True)


COLOCATED = [
    "cluster.colocate=true",
    "actor.engine=vllm",
    "actor.python=/bin/python3",
    "actor.gpu_memory_utilization=0.3",
]


def test_colocated_the_actor_runs_on_the_trainer_s_one_gpu(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(stages_module, "torch_sees_cuda", lambda: True)
    stages = {stage.name: stage for stage in build_stages(load_config(None, COLOCATED), tmp_path, tmp_path)}
    assert (
        stages["trainer0"].env["CUDA_VISIBLE_DEVICES"] == stages["actor0"].env["CUDA_VISIBLE_DEVICES"] == "0"
    )


def test_colocated_without_a_gpu_stops_before_any_process_naming_the_setting(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(GpuPlanError, match="cluster.colocate=true"):
        build_stages(load_config(None, COLOCATED), tmp_path, tmp_path)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["actor.num_actors=2"], "actor.num_actors=2 must be 1"),
        (["actor.tensor_parallel_size=2"], "actor.tensor_parallel_size=2 must be 1"),
        (["trainer.num_processes=2", "rl.batch_size=32"], "trainer.num_processes=2 must be 1"),
        (["trainer.device=cpu"], "trainer.device='cpu' must be 'auto' or 'cuda'"),
        (["transport.weight_backend=nccl"], "transport.weight_backend='nccl' must be"),
        (["actor.gpu_memory_utilization=0.9"], "would leave the trainer 10% of the shared GPU"),
    ],
)
def test_colocate_with_more_than_one_actor_or_rank_is_refused_by_the_config(extra, named) -> None:
    with pytest.raises(ConfigError, match=named):
        load_config(None, [*COLOCATED, *extra])
