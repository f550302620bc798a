"""Collectives: a real gloo all-reduce and broadcast between two CPU processes, and NCCL between every
pair of visible GPUs, each with its measured bandwidth. The pairs run in rounds of disjoint pairs (a
round-robin tournament: n - 1 rounds for n GPUs), a round's pairs at once."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from pipelinerl.doctor.checks import Check
from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.ports import free_port

SECTION = "Collectives"
MIB = 4.0
TIMEOUT_S = 90.0


def run_group(
    backend: str,
    host: str,
    world_size: int,
    port: int | None = None,
    timeout_s: float = TIMEOUT_S,
    visible: str | None = None,
) -> dict[str, Any]:
    """Start ``world_size`` ranks of the collective worker (seeing the GPUs ``visible`` names, as
    ``CUDA_VISIBLE_DEVICES``, when given); rank 0's answer, or ``error``."""
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
        outputs, timed_out = _run_ranks(backend, host, port, world_size, timeout_s, files, visible)
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
    visible: str | None = None,
) -> tuple[list[tuple[int, str, str]], bool]:
    """Each rank's exit status, stdout and stderr, and whether they ran out of time."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
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


def pair_rounds(count: int) -> list[list[tuple[int, int]]]:
    """Every pair of ``count`` devices exactly once, in rounds of disjoint pairs (the circle method)."""
    seats: list[int | None] = [*range(count), *([None] if count % 2 else [])]
    rounds = []
    for _ in range(len(seats) - 1):
        half = len(seats) // 2
        pairs = [(seats[i], seats[-1 - i]) for i in range(half)]
        rounds.append(sorted((min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None))
        seats = [seats[0], seats[-1], *seats[1:-1]]
    return rounds


def visible_ids(count: int, environ: Mapping[str, str] | None = None) -> list[str]:
    """The ids of the ``count`` GPUs torch sees, as ``CUDA_VISIBLE_DEVICES`` names them to a child."""
    environ = os.environ if environ is None else environ
    listed = [part.strip() for part in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    return listed[:count] if len(listed) >= count else [str(index) for index in range(count)]


def pair_verdict(answers: Mapping[tuple[int, int], dict[str, Any]], fix: str) -> Check:
    """Every pair's answer as one line: the slowest pair's bandwidth, or the pairs that failed."""
    name = f"NCCL, {len(answers)} GPU pair(s)"
    failed = {pair: answer for pair, answer in answers.items() if "error" in answer or not answer.get("ok")}
    data = {f"{a}-{b}": answer for (a, b), answer in answers.items()}
    if failed:
        shown = "; ".join(
            f"GPUs {a}-{b}: {answer.get('error', 'wrong values after the collective')}"
            for (a, b), answer in sorted(failed.items())[:3]
        )
        return Check(
            SECTION, name, "FAIL", f"{len(failed)} of {len(answers)} pairs failed: {shown}", fix, data
        )
    slowest = min(answers, key=lambda pair: answers[pair]["broadcast_mb_s"])
    fastest = max(answers, key=lambda pair: answers[pair]["broadcast_mb_s"])
    detail = (
        f"{answers[slowest]['megabytes']} MB broadcasts: slowest GPUs {slowest[0]}-{slowest[1]} "
        f"{answers[slowest]['broadcast_mb_s']:.0f} MB/s, fastest {fastest[0]}-{fastest[1]} "
        f"{answers[fastest]['broadcast_mb_s']:.0f} MB/s"
    )
    return Check(SECTION, name, "PASS", detail, data=data)


def check_nccl(config: PipelineConfig, gpus: int) -> Check:
    """NCCL between every pair of the visible GPUs (one GPU: that NCCL starts); skipped with a note
    where there are none."""
    fix = "rerun with NCCL_DEBUG=INFO; check NCCL_SOCKET_IFNAME, NCCL_P2P_DISABLE"
    if gpus == 0:
        return Check(SECTION, "NCCL", "SKIP", "no GPU visible to torch: runs use gloo")
    ids = visible_ids(gpus)
    if gpus == 1:
        check = _verdict(
            "NCCL, 1 GPU", "nccl", run_group("nccl", config.transport.host, 1, visible=ids[0]), fix
        )
        if check.status == "PASS":
            check.detail += " (one GPU: NCCL starts; no peer to measure)"
        return check
    answers: dict[tuple[int, int], dict[str, Any]] = {}

    def measure(pair: tuple[int, int]) -> None:
        answers[pair] = run_group("nccl", config.transport.host, 2, visible=f"{ids[pair[0]]},{ids[pair[1]]}")

    for pairs in pair_rounds(gpus):
        threads = [threading.Thread(target=measure, args=(pair,)) for pair in pairs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return pair_verdict(answers, fix)
