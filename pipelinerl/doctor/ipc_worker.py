"""One side of the doctor's CUDA IPC check: ``python -m pipelinerl.doctor.ipc_worker --role ...``.

``export`` puts a tensor on the GPU, prints its handle (``platform/cuda_ipc.py``, as the colocated
trainer hands its buckets to the vLLM worker) as one JSON line, and keeps the tensor alive until a
line arrives on stdin. ``open`` reads that line, opens the handle, checks every value, times copies
of it into memory of its own, and prints one JSON line."""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from pipelinerl.platform import cuda_ipc

REPEATS = 5


def expected(numel: int) -> torch.Tensor:
    return torch.arange(numel, dtype=torch.float32, device="cuda") % 997


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=("export", "open"), required=True)
    parser.add_argument("--mib", type=float, default=4.0)
    args = parser.parse_args()
    numel = int(args.mib * 1024 * 1024) // 4
    if args.role == "export":
        tensor = expected(numel)
        torch.cuda.synchronize()
        print(json.dumps({"handle": cuda_ipc.export(tensor).hex()}), flush=True)
        sys.stdin.readline()  # the other side has copied it: now it may be freed
        return
    handle = bytes.fromhex(json.loads(sys.stdin.readline())["handle"])
    shared = cuda_ipc.open_exported(handle)
    ok = bool(torch.equal(shared, expected(numel)))
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(REPEATS):
        copy = shared.clone()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / REPEATS
    megabytes = copy.numel() * 4 / 1e6
    print(
        json.dumps({"ok": ok, "megabytes": round(megabytes, 2), "copy_mb_s": round(megabytes / seconds, 1)})
    )


if __name__ == "__main__":
    main()
