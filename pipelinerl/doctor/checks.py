"""The result of one check, and helpers the checks share."""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["PASS", "WARN", "FAIL", "SKIP"]
STATUSES: tuple[Status, ...] = ("PASS", "WARN", "FAIL", "SKIP")


@dataclass
class Check:
    """One line of the report: what was checked, how it went, what was seen, how to fix it."""

    section: str
    name: str
    status: Status
    detail: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def release(version: str) -> tuple[int, ...] | None:
    """The numeric release of a version string (``2.13.0+cpu`` -> (2, 13, 0)); None if there is none."""
    parts: list[int] = []
    for piece in version.strip().split("+")[0].split("."):
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(parts) or None


def run_json(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``argv``, which prints one JSON object as its last line of stdout; raise ``RuntimeError``
    naming the command's own error when it fails, prints nothing or prints something else."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"gave no answer within {timeout_s:.0f} s") from None
    except OSError as error:
        raise RuntimeError(f"cannot be started: {error.strerror or error}") from None
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise RuntimeError(f"failed (exit {done.returncode}): {tail[:300]}")
    try:
        answer = json.loads(lines[-1])
    except json.JSONDecodeError:
        raise RuntimeError(f"printed no answer: {lines[-1][:200]!r}") from None
    if not isinstance(answer, dict):
        raise RuntimeError(f"printed no answer: {lines[-1][:200]!r}")
    return answer
