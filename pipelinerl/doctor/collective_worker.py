"""One rank of the doctor's collective check: ``python -m pipelinerl.doctor.collective_worker``.

Joins a process group the way the trainer ranks do (``platform.stores.init_trainer_group``), checks
an all-reduce and a broadcast of ``--mib`` MiB give the right values, times them, and prints one JSON
line (rank 0: the bandwidths)."""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from pipelinerl.platform.stores import init_trainer_group

REPEATS = 5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("gloo", "nccl"), required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--mib", type=float, default=4.0)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args()
    device = torch.device("cpu")
    if args.backend == "nccl":
        torch.cuda.set_device(args.rank)
        device = torch.device("cuda", args.rank)
    init_trainer_group(
        args.backend, args.host, args.port, args.rank, args.world_size, timedelta(seconds=args.timeout_s)
    )
    try:
        numel = int(args.mib * 1024 * 1024) // 4
        tensor = torch.full((numel,), float(args.rank + 1), device=device)
        dist.all_reduce(tensor)  # warm-up, and the check of the sum
        expected = args.world_size * (args.world_size + 1) / 2
        reduce_ok = bool((tensor == expected).all().item())
        timings: dict[str, float] = {}
        for name in ("all_reduce", "broadcast"):
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(REPEATS):
                if name == "all_reduce":
                    dist.all_reduce(tensor)
                else:
                    tensor.fill_(7.0 if args.rank == 0 else 0.0)
                    dist.broadcast(tensor, src=0)
            if device.type == "cuda":
                torch.cuda.synchronize()
            timings[name] = (time.perf_counter() - start) / REPEATS
        broadcast_ok = bool((tensor == 7.0).all().item())
        dist.barrier()
        megabytes = numel * 4 / 1e6
        print(
            json.dumps(
                {
                    "rank": args.rank,
                    "ok": reduce_ok and broadcast_ok,
                    "all_reduce_ok": reduce_ok,
                    "broadcast_ok": broadcast_ok,
                    "megabytes": round(megabytes, 2),
                    "all_reduce_mb_s": round(megabytes / timings["all_reduce"], 1),
                    "broadcast_mb_s": round(megabytes / timings["broadcast"], 1),
                }
            ),
            flush=True,
        )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
