"""Collectives: a real gloo all-reduce and broadcast between two CPU processes, and NCCL between the
visible GPUs, each with its measured bandwidth."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import IO, Any

from pipelinerl.doctor.checks import Check
from pipelinerl.platform.config import PipelineConfig

SECTION = "Collectives"
MIB = 4.0
TIMEOUT_S = 90.0


def free_port(host: str) -> int:
    """A port the kernel hands out on ``host`` now (bound to port 0, then released)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def run_group(
    backend: str, host: str, world_size: int, port: int | None = None, timeout_s: float = TIMEOUT_S
) -> dict[str, Any]:
    """Start ``world_size`` ranks of the collective worker; rank 0's answer, or ``error``."""
    port = free_port(host) if port is None else port
    # Files, not pipes: a rank that writes much while the others are waited for never blocks on them.
    with contextlib.ExitStack() as stack:
        files = [
            (
                stack.enter_context(tempfile.TemporaryFile("w+")),
                stack.enter_context(tempfile.TemporaryFile("w+")),
            )
            for _ in range(world_size)
        ]
        outputs, timed_out = _run_ranks(backend, host, port, world_size, timeout_s, files)
    if timed_out:
        return {"error": f"no answer within {timeout_s:.0f} s (port {port})", "port": port}
    # The rank that failed by itself names the cause; the ones stopped here (killed) do not.
    for rank, (code, _, stderr) in sorted(enumerate(outputs), key=lambda item: item[1][0] < 0):
        if code != 0:
            lines = [line for line in stderr.strip().splitlines() if line.strip()] or [f"exit {code}"]
            return {"error": f"rank {rank} failed: {lines[-1][:300]}", "port": port}
    try:
        return dict(json.loads(outputs[0][1].strip().splitlines()[-1])) | {"port": port}
    except (json.JSONDecodeError, IndexError):
        return {"error": f"rank 0 printed no answer: {outputs[0][1][-200:]!r}", "port": port}


def _run_ranks(
    backend: str,
    host: str,
    port: int,
    world_size: int,
    timeout_s: float,
    files: Sequence[tuple[IO[str], IO[str]]],
) -> tuple[list[tuple[int, str, str]], bool]:
    """Each rank's exit status, stdout and stderr, and whether they ran out of time."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    ranks = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipelinerl.doctor.collective_worker",
                *("--backend", backend, "--host", host, "--port", str(port)),
                *("--rank", str(rank), "--world-size", str(world_size), "--mib", str(MIB)),
                *("--timeout-s", str(timeout_s)),
            ],
            stdout=files[rank][0],
            stderr=files[rank][1],
            env=env,
        )
        for rank in range(world_size)
    ]
    deadline = time.monotonic() + timeout_s
    # Wait for every rank, but stop the others as soon as one fails (its peers would wait for it).
    while any(process.poll() is None for process in ranks) and time.monotonic() < deadline:
        if any(process.poll() not in (None, 0) for process in ranks):
            break
        time.sleep(0.05)
    timed_out = any(process.poll() is None for process in ranks) and time.monotonic() >= deadline
    for process in ranks:
        if process.poll() is None:
            process.kill()
    return [
        (process.wait(), _read(files[rank][0]), _read(files[rank][1])) for rank, process in enumerate(ranks)
    ], timed_out


def _read(file: IO[str]) -> str:
    file.seek(0)
    return file.read()


def _verdict(name: str, backend: str, answer: dict[str, Any], fix: str) -> Check:
    if "error" in answer:
        return Check(SECTION, name, "FAIL", f"{backend}: {answer['error']}", fix, answer)
    if not answer.get("ok"):
        return Check(SECTION, name, "FAIL", f"{backend}: wrong values after the collective", fix, answer)
    detail = (
        f"{answer['megabytes']} MB: all-reduce {answer['all_reduce_mb_s']:.0f} MB/s, "
        f"broadcast {answer['broadcast_mb_s']:.0f} MB/s"
    )
    return Check(SECTION, name, "PASS", detail, data=answer)


def check_gloo(config: PipelineConfig, port: int | None = None) -> Check:
    answer = run_group("gloo", config.transport.host, 2, port)
    return _verdict(
        "gloo, 2 CPU processes",
        "gloo",
        answer,
        f"check that {config.transport.host} is reachable between processes "
        "(transport.host, GLOO_SOCKET_IFNAME)",
    )


def check_nccl(config: PipelineConfig, gpus: int) -> Check:
    """NCCL between the visible GPUs (two at most); skipped with a note where there are none."""
    if gpus == 0:
        return Check(SECTION, "NCCL", "SKIP", "no GPU visible to torch: runs use gloo")
    world = min(2, gpus)
    answer = run_group("nccl", config.transport.host, world)
    check = _verdict(
        f"NCCL, {world} GPU(s)",
        "nccl",
        answer,
        "rerun with NCCL_DEBUG=INFO; check NCCL_SOCKET_IFNAME, NCCL_P2P_DISABLE",
    )
    if world == 1 and check.status == "PASS":
        check.detail += " (one GPU: NCCL starts; no peer to measure)"
    return check
