"""``doctor --smoke``'s pure parts: where the run goes by the GPUs there are, what its records say and
when it fails; and its memory sampler reading a stand-in ``nvidia-smi`` for the GPU branch."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from pipelinerl.doctor.smoke import MemorySampler, device_label, run_smoke
from pipelinerl.doctor.smoke_figures import figures_of, smoke_checks
from pipelinerl.doctor.smoke_placement import SMOKE_STEPS, smoke_overrides
from pipelinerl.platform.config import load_config, with_overrides


def placed(gpus: int):
    return with_overrides(load_config(), smoke_overrides(gpus))


def test_on_cpu_the_config_keeps_its_placement_and_only_gets_short() -> None:
    config = placed(0)
    default = load_config()
    assert config.run.max_steps == SMOKE_STEPS and config.eval.every == 0
    assert (config.actor.engine, config.trainer.device, config.transport.weight_backend) == (
        default.actor.engine,
        default.trainer.device,
        default.transport.weight_backend,
    )


def test_one_gpu_colocates_a_vllm_actor_in_bf16_with_cuda_graphs() -> None:
    config = placed(1)  # validated: the colocation rules hold (one actor, one rank, a share <= 0.6)
    assert config.cluster.colocate and config.transport.weight_backend == "ipc"
    assert (config.actor.engine, config.model.dtype, config.actor.cuda_graphs) == ("vllm", "bfloat16", "on")
    assert config.trainer.device == "cuda" and config.actor.gpu_memory_utilization <= 0.6


def test_two_gpus_put_the_actor_on_its_own_gpu_with_nccl() -> None:
    config = placed(2)
    assert not config.cluster.colocate and config.transport.weight_backend == "nccl"
    assert config.actor.num_actors == 1 and config.trainer.num_processes == 1


def test_a_users_settings_outside_the_placement_survive() -> None:
    user = load_config(None, ["rl.batch_size=16", "actor.max_in_flight=16", "run.max_steps=50"])
    config = with_overrides(user, smoke_overrides(2))
    assert (config.rl.batch_size, config.actor.max_in_flight, config.run.max_steps) == (16, 16, SMOKE_STEPS)


def test_a_negative_gpu_count_is_refused() -> None:
    with pytest.raises(ValueError, match="gpus must be 0 or more, not -1"):
        smoke_overrides(-1)


def trainer_records(steps: int) -> list[dict]:
    return [
        {"policy_version": step, "trainer/step_s": 0.5 + step, "trainer/tokens": 100}
        for step in range(1, steps + 1)
    ]


def actor_record(version: int, pause: float, load: float, receive: float | None = None, **extra) -> dict:
    record = {
        "actor_id": 0,
        "policy_version": version,
        "weights/update_pause_ms": pause,
        "weights/update_phase_ms/pause": pause - load - (receive or 0.0),
        "weights/update_phase_ms/load": load,
        "weights/receive_ms": receive or 7.0,
        "throughput/actor_tokens_per_s": 1000.0 * version,
        "actor/weight_buckets_refused": 0,
        "actor/notices_lost": 0,
    }
    if receive is not None:
        record["weights/update_phase_ms/receive"] = receive
    return record | extra


def test_figures_are_medians_of_the_records() -> None:
    actor = [actor_record(1, 10.0, 4.0), actor_record(2, 30.0, 6.0), actor_record(3, 20.0, 5.0)]
    figures = figures_of(trainer_records(3), actor, {"host": 1.5, "cuda:0": 20.0})
    assert figures.steps == 3 and figures.updates_loaded == 3
    assert figures.update_pause_ms_median == 20.0 and figures.update_pause_ms_max == 30.0
    assert figures.update_phases_ms_median == {"pause": 15.0, "load": 5.0}
    assert figures.actor_tokens_per_s_median == 2000.0 and figures.trainer_step_s_median == 2.5
    checks = {check.name: check for check in smoke_checks(figures, 3, "CPU")}
    assert all(check.status == "PASS" for check in checks.values()), checks
    assert "pause median 20.0 ms" in checks["in-flight updates"].detail
    assert "cuda:0 20.00 GiB" in checks["peak memory"].detail


def test_a_run_short_of_its_steps_fails() -> None:
    figures = figures_of(trainer_records(2), [actor_record(1, 10.0, 4.0)], {})
    steps = next(check for check in smoke_checks(figures, 3, "CPU") if check.name == "steps")
    assert steps.status == "FAIL" and "2 of 3 steps" in steps.detail and "*.log" in steps.fix


@pytest.mark.parametrize(
    ("actor", "shown"),
    [
        ([], "0 loaded"),
        ([actor_record(1, 10.0, 4.0, **{"actor/weight_buckets_refused": 2})], "2 buckets refused"),
        ([actor_record(1, 10.0, 4.0, **{"actor/notices_lost": 1})], "1 notices lost"),
    ],
)
def test_updates_not_loaded_refused_or_lost_fail(actor: list[dict], shown: str) -> None:
    figures = figures_of(trainer_records(3), actor, {})
    updates = next(check for check in smoke_checks(figures, 3, "CPU") if check.name == "in-flight updates")
    assert updates.status == "FAIL" and shown in updates.detail and "transport.weight_backend" in updates.fix


def test_device_labels_are_file_names() -> None:
    assert device_label([]) == "cpu"
    assert device_label(["NVIDIA H200", "NVIDIA H200"]) == "nvidia-h200"
    assert device_label(["NVIDIA A100-SXM4-80GB"]) == "nvidia-a100-sxm4-80gb"


def test_the_sampler_keeps_each_gpus_peak_from_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = tmp_path / "calls"
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    # A stand-in driver: GPU 0 uses 1000 MiB then 3000 then 2000; GPU 1 always 500 MiB.
    smi.write_text(
        "#!/bin/sh\n"
        f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n + 1)) > {counter}\n"
        "case $n in 0) used=1000;; 1) used=3000;; *) used=2000;; esac\n"
        'echo "0, $used"\necho "1, 500"\n'
    )
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    sampler = MemorySampler(gpus=2)
    for _ in range(3):
        sampler.sample()
    peaks = sampler.peak_gib()
    assert peaks["cuda:0"] == pytest.approx(3000 / 1024, abs=1e-3)
    assert peaks["cuda:1"] == pytest.approx(500 / 1024, abs=1e-3)
    assert peaks["host"] > 0.01  # this test process's own memory


def test_a_run_that_cannot_start_is_one_fail_naming_why(tmp_path: Path) -> None:
    with socket.socket() as taken:  # the run's first port is in use: its launch refuses before starting
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = load_config(
            None,
            [
                f"transport.base_port={port}",
                f"run.home={tmp_path / 'home'}",
                f"run.output_dir={tmp_path / 'runs'}",
                "tracking.enabled=false",
            ],
        )
        result = run_smoke(config, [], record_path=tmp_path / "record.json")
    (check,) = result.checks
    assert check.status == "FAIL" and check.name == "run" and str(port) in check.detail, check
    assert result.figures is None and not (tmp_path / "record.json").exists(), "no record of a failed run"
