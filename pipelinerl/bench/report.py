"""What every benchmark writes: a JSON record under ``docs/benchmarks/`` and a markdown table.

A record holds the headline numbers at its top level (``headroom_over_actor``,
``continuous_over_static_ratio``, ...) so a later run can be compared with an earlier one by key,
and beside them what makes a number meaningful: the exact command, the git commit, a UTC
timestamp, the machine (CPU, cores, memory, accelerator, library versions) and the load average
before and after, because a shared machine's other work slows a benchmark down without saying so.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

DEFAULT_DIRECTORY = Path("docs/benchmarks")
SCHEMA_VERSION = 1
# Libraries whose versions decide the numbers (absent ones are reported as absent, not imported).
VERSIONED_PACKAGES = ("torch", "transformers", "pyzmq", "msgspec", "numpy", "vllm")


def default_path(name: str) -> Path:
    """Where ``pipelinerl bench <name>`` writes by default (relative to the working directory)."""
    return DEFAULT_DIRECTORY / f"{name}.json"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _accelerator() -> str:
    # Only asks torch if the benchmark already imported it: describing the machine must not cost
    # a torch import (seconds) in a benchmark that does not need torch.
    torch = sys.modules.get("torch")
    if torch is not None:
        if torch.cuda.is_available():
            names = {torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())}
            return f"{torch.cuda.device_count()} x {', '.join(sorted(names))}"
        return "none (torch sees no CUDA device)"
    return "not checked (torch not loaded)"


def _package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def machine_description() -> dict[str, Any]:
    """The hardware and software a benchmark ran on."""
    usable_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "hostname": platform.node(),
        "cpu": _cpu_model(),
        "architecture": platform.machine(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable_cores,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "accelerator": _accelerator(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "packages": _package_versions(),
    }


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages (a 2-core machine is busy above about 2)."""
    return [round(value, 2) for value in os.getloadavg()]


def git_state(directory: Path | None = None) -> dict[str, Any]:
    """The commit checked out where the package lives, and whether tracked files differ from it."""
    directory = directory or Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            completed = subprocess.run(
                ["git", *args], cwd=directory, capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return completed.stdout.strip()

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": bool(status) if status is not None else None}


def command_line() -> str:
    """The command as typed: ``pipelinerl bench ...`` when run through the console script."""
    program = Path(sys.argv[0]).name if sys.argv else "python"
    if program in ("cli.py", "__main__.py"):  # python -m pipelinerl.cli: the same command
        program = "pipelinerl"
    return shlex.join([program, *sys.argv[1:]])


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def build_record(
    name: str,
    *,
    headline: dict[str, Any],
    settings: dict[str, Any],
    details: dict[str, Any],
    targets: dict[str, dict[str, Any]],
    notes: Sequence[str],
    load_before: list[float],
    started_at: datetime,
    command: str | None = None,
) -> dict[str, Any]:
    """One benchmark's record: headline numbers first, then how and where they were measured."""
    finished_at = datetime.now(UTC)
    record = {
        "benchmark": name,
        "schema_version": SCHEMA_VERSION,
        **headline,
        "targets": targets,
        "command": command or command_line(),
        "timestamp": finished_at.isoformat(timespec="seconds"),
        "duration_s": round((finished_at - started_at).total_seconds(), 1),
        **git_state(),
        "machine": machine_description(),
        "load_average": {"before": load_before, "after": load_average()},
        "settings": settings,
        "notes": list(notes),
        **details,
    }
    return json_safe(record)


def write_record(record: dict[str, Any], path: Path) -> Path:
    """Write ``record`` as indented JSON (parents created; NaN refused: it is not JSON)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, allow_nan=False) + "\n")
    return path


def format_value(value: Any, digits: int = 3) -> str:
    """A table cell: floats with ``digits`` significant digits (thousands separated), the rest as is."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "—"
        if value != 0 and abs(value) >= 10 ** (digits - 1):
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured pipe table; cells go through ``format_value``."""
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row {list(row)!r} has {len(row)} cells; the table has {len(headers)} columns")
        lines.append("| " + " | ".join(format_value(cell).replace("|", "\\|") for cell in row) + " |")
    return "\n".join(lines)


def target_check(value: float | None, *, at_least: float | None = None, below: float | None = None) -> dict:
    """A target and whether ``value`` meets it (``met`` is None when there is no value)."""
    if (at_least is None) == (below is None):
        raise ValueError("give exactly one of at_least and below")
    if at_least is not None:
        return {"at_least": at_least, "value": value, "met": None if value is None else value >= at_least}
    assert below is not None  # exactly one of the two was given
    return {"below": below, "value": value, "met": None if value is None else value < below}
