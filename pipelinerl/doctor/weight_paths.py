"""How this config's weight updates would travel on this machine: the backend that
``transport.weight_backend`` resolves to here, and, where colocation would be used, a real CUDA IPC
hand-over between two processes on one GPU (``ipc_worker``)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from typing import Any

from pipelinerl.doctor.checks import Check
from pipelinerl.doctor.collectives import SECTION, TIMEOUT_S, visible_ids
from pipelinerl.launch.gpus import GpuPlanError, trainer_device
from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.weights import weight_backend

# Which check of this section measures each backend.
MEASURED_BY = {"gloo": "gloo, 2 CPU processes", "nccl": "NCCL", "ipc": "CUDA IPC"}


def check_weight_backend(config: PipelineConfig, gpu_ids: list[str], torch_cuda: bool) -> Check:
    """The weight group's backend for ``config`` here (``weights.weight_backend``, as trainer rank 0
    resolves it), or the refusal a run would meet, naming the setting."""
    name, setting = "weight updates", config.transport.weight_backend
    try:
        device = trainer_device(config.trainer.device, gpu_ids, torch_cuda)
        backend = weight_backend(setting, device, config.actor.engine, config.cluster.colocate)
    except (GpuPlanError, ValueError) as error:
        return Check(
            SECTION, name, "FAIL", str(error), "change transport.weight_backend (auto, gloo, nccl, ipc)"
        )
    detail = (
        f"transport.weight_backend={setting!r} resolves to {backend} here (trainer on {device}, "
        f"actor.engine={config.actor.engine!r}); measured by the {MEASURED_BY[backend]} check"
    )
    return Check(SECTION, name, "PASS", detail, data={"backend": backend, "trainer_device": device})


def check_cuda_ipc(config: PipelineConfig, gpus: int) -> Check:
    """A CUDA IPC hand-over between two processes on the first GPU, where colocation would be used
    (``cluster.colocate``, or a machine with one GPU); skipped elsewhere, saying why."""
    name = "CUDA IPC"
    if gpus == 0:
        return Check(SECTION, name, "SKIP", "no GPU visible to torch: updates never use CUDA IPC here")
    if gpus > 1 and not config.cluster.colocate:
        return Check(SECTION, name, "SKIP", f"{gpus} GPUs and cluster.colocate=false: updates use NCCL")
    answer = ipc_handover(visible_ids(gpus)[0])
    fix = "colocation needs CUDA IPC between processes: check the driver, containers' --ipc=host"
    if "error" in answer:
        return Check(SECTION, name, "FAIL", answer["error"], fix, answer)
    if not answer.get("ok"):
        return Check(SECTION, name, "FAIL", "the tensor opened by handle holds other values", fix, answer)
    gpu = visible_ids(gpus)[0]
    detail = f"{answer['megabytes']} MB handed over on GPU {gpu}: copy {answer['copy_mb_s']:.0f} MB/s"
    return Check(SECTION, name, "PASS", detail, data=answer)


def ipc_handover(gpu: str, timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    """Export a tensor in one process and open it in another, both on ``gpu``; the opener's answer,
    or ``error`` naming the side that failed."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu, OMP_NUM_THREADS="1")
    worker = [sys.executable, "-m", "pipelinerl.doctor.ipc_worker"]
    with subprocess.Popen(
        [*worker, "--role", "export"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as exporter:
        assert exporter.stdin is not None and exporter.stdout is not None
        watchdog = threading.Timer(timeout_s, exporter.kill)  # a hung exporter never blocks the doctor
        watchdog.start()
        try:
            handle = exporter.stdout.readline()
            if not handle.strip():  # it failed, or the watchdog stopped it
                exporter.kill()
                tail = (exporter.communicate(timeout=10)[1].strip().splitlines() or ["no output"])[-1]
                return {"error": f"the exporting process failed: {tail[:300]}"}
            opened = subprocess.run(
                [*worker, "--role", "open"],
                input=handle,
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            exporter.kill()
            return {"error": f"no answer within {timeout_s:.0f} s"}
        finally:
            with contextlib.suppress(OSError, ValueError):  # it may be gone, its stdin closed
                exporter.stdin.write("done\n")
                exporter.stdin.flush()
            watchdog.cancel()
        exporter.wait(timeout=timeout_s)
    lines = [line for line in opened.stdout.splitlines() if line.strip()]
    if opened.returncode != 0 or not lines:
        tail = (opened.stderr.strip().splitlines() or [f"exit {opened.returncode}"])[-1]
        return {"error": f"the opening process failed: {tail[:300]}"}
    return dict(json.loads(lines[-1]))
