"""This machine: Python, the torch build against the NVIDIA driver, the GPUs, memory and disk."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from pipelinerl.doctor.checks import Check, Status, release
from pipelinerl.platform.config import PipelineConfig

SECTION = "This machine"
MIN_PYTHON = (3, 11)
GIB = 1024**3
# Below these a run is unlikely to finish (FAIL) or may run short (WARN).
MEMORY_FAIL_GIB, MEMORY_WARN_GIB = 2.0, 8.0
DISK_FAIL_GIB, DISK_WARN_GIB = 2.0, 20.0
# vLLM's GPU kernels need compute capability 7.0; bf16 needs 8.0 (Ampere).
MIN_CAPABILITY, BF16_CAPABILITY = (7, 0), (8, 0)
SMI_TIMEOUT_S = 20


def torch_facts() -> dict[str, Any]:
    """What this environment's torch is and sees (an ``error`` key when it cannot be imported)."""
    try:
        import torch  # noqa: PLC0415 (heavy: only when the check runs)
    except Exception as error:  # a broken install raises more than ImportError
        return {"error": f"{type(error).__name__}: {error}"}
    devices = []
    available = bool(torch.cuda.is_available())
    for index in range(torch.cuda.device_count() if available else 0):
        props = torch.cuda.get_device_properties(index)
        devices.append(
            {
                "index": index,
                "name": props.name,
                "memory_gib": round(props.total_memory / GIB, 1),
                "capability": [props.major, props.minor],
            }
        )
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": available,
        "devices": devices,
    }


def nvidia_smi_facts() -> dict[str, Any] | None:
    """The driver as ``nvidia-smi`` on PATH reports it; None without one, ``error`` when it fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    facts: dict[str, Any] = {"path": smi}
    try:
        header = subprocess.run([smi], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
        if header.returncode != 0:
            lines = (header.stdout + header.stderr).strip().splitlines() or [f"exit {header.returncode}"]
            return facts | {"error": lines[0][:200]}
        for label, key in (("Driver Version:", "driver"), ("CUDA Version:", "cuda")):
            if label in header.stdout:
                facts[key] = header.stdout.split(label, 1)[1].split()[0]
        query = subprocess.run(
            [smi, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError) as error:
        return facts | {"error": str(error)[:200]}
    gpus = []
    for line in query.stdout.splitlines() if query.returncode == 0 else []:
        parts = [part.strip() for part in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            memory = float(parts[2]) / 1024 if parts[2].replace(".", "").isdigit() else None
            gpus.append({"index": parts[0], "name": parts[1], "memory_gib": memory})
    return facts | {"gpus": gpus}


def check_python() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    detail = f"Python {version} ({sys.executable})"
    if sys.version_info[:2] < MIN_PYTHON:
        return Check(SECTION, "python", "FAIL", detail, "use Python 3.11 or newer")
    return Check(SECTION, "python", "PASS", detail)


def check_torch(config: PipelineConfig, torch: dict[str, Any], smi: dict[str, Any] | None) -> Check:
    """The torch build, and with CUDA its CUDA release against the one the driver supports."""
    if "error" in torch:
        return Check(SECTION, "torch", "FAIL", f"cannot import torch: {torch['error']}", "pip install torch")
    build = f"CUDA {torch['cuda']} build" if torch["cuda"] else "CPU build"
    detail = f"torch {torch['version']}, {build}"
    data = {"torch": torch["version"], "cuda": torch["cuda"], "driver": smi}
    if smi is None:
        if torch["cuda"]:
            return Check(
                SECTION,
                "torch",
                "WARN",
                f"{detail}; no nvidia-smi on PATH, no driver to compare with",
                "install the NVIDIA driver (nvidia-smi), or a CPU build of torch on a machine without GPUs",
                data,
            )
        return Check(SECTION, "torch", "PASS", f"{detail}; no NVIDIA driver (nvidia-smi) here", data=data)
    if "error" in smi:
        return Check(
            SECTION,
            "torch",
            "FAIL",
            f"{detail}; nvidia-smi fails: {smi['error']}",
            "load the NVIDIA driver (nvidia-smi must answer), or remove the broken nvidia-smi from PATH",
            data,
        )
    driver = f"driver {smi.get('driver', '?')} (CUDA {smi.get('cuda', '?')})"
    if not torch["cuda"]:
        gpus = len(smi.get("gpus", []))
        status: Status = "FAIL" if config.trainer.device == "cuda" else "WARN"
        return Check(
            SECTION,
            "torch",
            status,
            f"{detail}, but nvidia-smi lists {gpus} GPU(s), {driver}: the GPUs go unused",
            f"install a CUDA build of torch for CUDA {smi.get('cuda', '?')} or older, "
            "or use trainer.device='cpu'",
            data,
        )
    torch_cuda, driver_cuda = release(torch["cuda"]), release(str(smi.get("cuda", "")))
    detail = f"{detail}; {driver}"
    if torch_cuda is None or driver_cuda is None:
        return Check(SECTION, "torch", "WARN", f"{detail}: CUDA releases not comparable", data=data)
    if torch_cuda[0] > driver_cuda[0]:
        return Check(
            SECTION,
            "torch",
            "FAIL",
            f"{detail}: torch needs CUDA {torch['cuda']}, newer than the driver supports",
            f"upgrade the NVIDIA driver to one for CUDA {torch['cuda']}, or install torch built for CUDA "
            f"{smi.get('cuda')} or older",
            data,
        )
    if torch_cuda[:2] > driver_cuda[:2]:
        return Check(
            SECTION,
            "torch",
            "WARN",
            f"{detail}: torch's CUDA is a newer minor release than the driver's "
            "(minor-version compatibility)",
            "upgrade the NVIDIA driver if kernels fail to load (PTX JIT needs the newer driver)",
            data,
        )
    if not torch["cuda_available"]:
        return Check(
            SECTION,
            "torch",
            "FAIL",
            f"{detail}: torch.cuda.is_available() is False",
            "check CUDA_VISIBLE_DEVICES and that the driver matches (nvidia-smi, dmesg)",
            data,
        )
    return Check(SECTION, "torch", "PASS", detail, data=data)


def check_gpus(torch: dict[str, Any], smi: dict[str, Any] | None) -> Check:
    """The GPUs torch sees, with memory and compute capability."""
    devices = torch.get("devices", [])
    if not devices:
        listed = len((smi or {}).get("gpus", []))
        if listed:
            return Check(
                SECTION,
                "GPUs",
                "WARN",
                f"torch sees no GPU; nvidia-smi lists {listed}",
                "install a CUDA build of torch, or check CUDA_VISIBLE_DEVICES",
            )
        return Check(SECTION, "GPUs", "SKIP", "no GPU: the platform runs on CPU (gloo, transformers engine)")
    names = "; ".join(
        f"{d['index']}: {d['name']} {d['memory_gib']} GiB cc {d['capability'][0]}.{d['capability'][1]}"
        for d in devices
    )
    old = [d for d in devices if tuple(d["capability"]) < MIN_CAPABILITY]
    if old:
        return Check(
            SECTION,
            "GPUs",
            "FAIL",
            names,
            "vLLM needs compute capability 7.0+: use newer GPUs",
            {"devices": devices},
        )
    no_bf16 = [d for d in devices if tuple(d["capability"]) < BF16_CAPABILITY]
    if no_bf16:
        return Check(
            SECTION, "GPUs", "WARN", names, "no bf16 below compute capability 8.0: set model.dtype='float32'"
        )
    return Check(SECTION, "GPUs", "PASS", names, data={"devices": devices})


def check_visible_devices(smi: dict[str, Any] | None, environ: dict[str, str] | None = None) -> Check:
    environ = dict(os.environ) if environ is None else environ
    listed = [gpu["index"] for gpu in (smi or {}).get("gpus", [])]
    if "CUDA_VISIBLE_DEVICES" not in environ:
        detail = f"unset: every GPU ({len(listed)})" if listed else "unset"
        return Check(SECTION, "CUDA_VISIBLE_DEVICES", "PASS", detail)
    value = environ["CUDA_VISIBLE_DEVICES"]
    ids = [part.strip() for part in value.split(",") if part.strip()]
    if not ids:
        status: Status = "WARN" if listed else "PASS"
        return Check(
            SECTION,
            "CUDA_VISIBLE_DEVICES",
            status,
            "set empty: every GPU is hidden",
            "unset CUDA_VISIBLE_DEVICES to use the GPUs" if listed else "",
        )
    unknown = [gpu for gpu in ids if gpu.isdigit() and listed and gpu not in listed]
    if unknown:
        return Check(
            SECTION,
            "CUDA_VISIBLE_DEVICES",
            "FAIL",
            f"{value!r} names GPU {', '.join(unknown)}; nvidia-smi lists {', '.join(listed)}",
            "set CUDA_VISIBLE_DEVICES to GPUs this machine has",
        )
    return Check(SECTION, "CUDA_VISIBLE_DEVICES", "PASS", repr(value))


def check_memory() -> Check:
    memory = psutil.virtual_memory()
    available, total = memory.available / GIB, memory.total / GIB
    detail = f"{available:.1f} GiB available of {total:.1f} GiB"
    data = {"available_gib": round(available, 2), "total_gib": round(total, 2)}
    if available < MEMORY_FAIL_GIB:
        return Check(SECTION, "memory", "FAIL", detail, "stop other programs or use a larger machine", data)
    if available < MEMORY_WARN_GIB:
        return Check(SECTION, "memory", "WARN", detail, "enough for the embedded tiny model only", data)
    return Check(SECTION, "memory", "PASS", detail, data=data)


def _existing(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(name: str, path: Path, setting: str) -> Check:
    """Free space where ``path`` is (or would be created) and that it can be written."""
    where = _existing(path)
    free = shutil.disk_usage(where).free / GIB
    target = path.expanduser().absolute()
    shown = str(target)
    detail = f"{free:.1f} GiB free at {shown}" + ("" if where == target else " (to create)")
    data = {"path": shown, "free_gib": round(free, 2)}
    if not os.access(where, os.W_OK):
        return Check(
            SECTION, name, "FAIL", f"{where} is not writable", f"set {setting} to a writable directory", data
        )
    if free < DISK_FAIL_GIB:
        return Check(SECTION, name, "FAIL", detail, f"free disk space, or set {setting} elsewhere", data)
    if free < DISK_WARN_GIB:
        return Check(
            SECTION, name, "WARN", detail, f"checkpoints fill disks: free space or move {setting}", data
        )
    return Check(SECTION, name, "PASS", detail, data=data)


def machine_checks(
    config: PipelineConfig, torch: dict[str, Any] | None = None, smi: dict[str, Any] | None | bool = True
) -> list[Check]:
    """Every check of this machine; ``torch`` and ``smi`` stand in for the real facts in tests."""
    torch = torch_facts() if torch is None else torch
    driver = nvidia_smi_facts() if smi is True else (smi or None)
    return [
        check_python(),
        check_torch(config, torch, driver),
        check_gpus(torch, driver),
        check_visible_devices(driver),
        check_memory(),
        check_disk("disk: platform home", config.run.home, "run.home"),
        check_disk("disk: run output", config.run.output_dir, "run.output_dir"),
    ]
