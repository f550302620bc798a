"""``pipelinerl doctor --smoke``: a 3-step run of the config on this machine's devices, its figures,
and the benchmark record they make (``docs/benchmarks/smoke-<device>.json``).

The run is a real one (``launch``: every stage a process, the run tracked where the config says);
``smoke_placement`` says how it is placed on 0, 1 or more GPUs and ``smoke_figures`` reads its
records. While it runs, a thread samples the memory of every device: this process's tree of
processes on the host, and each GPU's memory in use (``nvidia-smi``) where there are GPUs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelinerl.bench.report import build_record, default_path, load_average, write_record
from pipelinerl.doctor.checks import Check
from pipelinerl.doctor.smoke_figures import SECTION, SmokeFigures, figures_of, smoke_checks
from pipelinerl.doctor.smoke_placement import SMOKE_STEPS, placement_label, smoke_overrides
from pipelinerl.launch.launcher import launch
from pipelinerl.launch.stages import tree_rss_bytes
from pipelinerl.platform.config import PipelineConfig, with_overrides
from pipelinerl.platform.jsonl import JsonlTail

GIB = 2**30
SAMPLE_EVERY_S = 0.5


def device_label(gpu_names: list[str]) -> str:
    """``cpu``, or the GPUs' name as a file name (``NVIDIA H200`` -> ``nvidia-h200``)."""
    if not gpu_names:
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", gpu_names[0].lower()).strip("-") or "gpu"


class MemorySampler:
    """Peak memory per device while a run goes: ``host`` (this process and its descendants, which
    are every stage of a local run) and ``cuda:<i>`` (``nvidia-smi``'s memory in use per GPU)."""

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.peak_bytes: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, daemon=True, name="memory-sampler")

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            self.sample()

    def _keep(self, device: str, used: int) -> None:
        self.peak_bytes[device] = max(self.peak_bytes.get(device, 0), used)

    def sample(self) -> None:
        self._keep("host", tree_rss_bytes(os.getpid()))
        if self.gpus and (smi := shutil.which("nvidia-smi")):
            query = [smi, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
            try:
                done = subprocess.run(query, capture_output=True, text=True, timeout=10)
            except (OSError, subprocess.SubprocessError):
                return
            for line in done.stdout.splitlines():
                index, _, used = (part.strip() for part in line.partition(","))
                if index.isdigit() and used.replace(".", "").isdigit():
                    self._keep(f"cuda:{index}", int(float(used) * 2**20))

    def peak_gib(self) -> dict[str, float]:
        return {device: round(used / GIB, 3) for device, used in self.peak_bytes.items()}


@dataclass
class SmokeResult:
    checks: list[Check]
    figures: SmokeFigures | None
    run_dir: Path | None
    record_path: Path | None


def run_smoke(
    config: PipelineConfig,
    gpu_names: list[str],
    *,
    record_path: Path | None = None,
    on_status: Callable[[str], None] | None = None,
) -> SmokeResult:
    """Run the smoke run of ``config`` on this machine's GPUs (``gpu_names``, none on CPU); write its
    record when it passes (``record_path``, default ``docs/benchmarks/smoke-<device>.json``)."""
    overrides = smoke_overrides(len(gpu_names))
    placement = placement_label(len(gpu_names))
    device = device_label(gpu_names)
    smoke_config = with_overrides(config, overrides)
    started_at, load_before = datetime.now(UTC), load_average()
    run_id = f"smoke-{device}-{started_at:%Y%m%d-%H%M%S}"
    try:
        with MemorySampler(len(gpu_names)) as memory:
            result = launch(smoke_config, run_id=run_id, on_status=on_status)
    except Exception as error:
        run_dir = (smoke_config.run.output_dir / run_id).resolve()
        detail = f"the run failed: {type(error).__name__}: {error}"
        fix = f"read the stage logs in {run_dir}" if run_dir.is_dir() else "fix the error above"
        return SmokeResult([Check(SECTION, "run", "FAIL", detail[:600], fix)], None, None, None)
    trainer = JsonlTail(result.run_dir / "metrics.jsonl").read()
    actor = JsonlTail(result.run_dir / "actor0.jsonl").read()
    figures = figures_of(trainer, actor, memory.peak_gib())
    checks = smoke_checks(figures, SMOKE_STEPS, placement)
    checks.insert(1, Check(SECTION, "run", "PASS", f"{result.run_dir} ({device})", data={"run_id": run_id}))
    written = None
    if not any(check.status == "FAIL" for check in checks):
        record = smoke_record(figures, overrides, placement, device, result.run_dir, started_at, load_before)
        written = write_record(record, record_path or default_path(f"smoke-{device}"))
        write_record(record, result.run_dir / "smoke.json")
        checks.append(Check(SECTION, "record", "PASS", f"written to {written}"))
    return SmokeResult(checks, figures, result.run_dir, written)


def smoke_record(
    figures: SmokeFigures,
    overrides: dict[str, Any],
    placement: str,
    device: str,
    run_dir: Path,
    started_at: datetime,
    load_before: list[float],
) -> dict[str, Any]:
    """The benchmark record of a passing smoke run: its figures at the top, labelled with the device."""
    return build_record(
        "smoke",
        headline={
            "device": device,
            "update_pause_ms_median": figures.update_pause_ms_median,
            "actor_tokens_per_s": figures.actor_tokens_per_s_median,
            "trainer_step_s": figures.trainer_step_s_median,
            "peak_memory_gib": figures.peak_memory_gib,
        },
        settings=overrides,
        details={"placement": placement, "figures": figures.as_dict(), "run_dir": str(run_dir)},
        targets={},
        notes=[
            "pipelinerl doctor --smoke: a 3-step run of the config on this machine's devices",
            "update phases: workers/update_phases.py; peak memory sampled every "
            f"{SAMPLE_EVERY_S} s (host: the run's processes; cuda:<i>: nvidia-smi's memory.used)",
        ],
        load_before=load_before,
        started_at=started_at,
    )
