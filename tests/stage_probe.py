"""A stand-in stage for the stage server's tests: ``main(argv)`` as every stage module has, reporting
what it was started with. ``argv``: the report's path, then ``exit:N``, ``raise`` or ``sleep`` (optional)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch  # noqa: F401 (as a stage module imports its libraries: the server imports them with it)

WATCHED = ("deepspeed", "pipelinerl.workers.trainer")  # what a server of a node without a trainer never loads
IMPORTED_IN = os.getpid()  # the process that imported this module: the stage server, for a forked stage


def main(argv: list[str]) -> None:
    report, *action = argv
    umask = os.umask(0)
    os.umask(umask)
    Path(report).write_text(
        json.dumps(
            {
                "sys_argv": sys.argv,
                "probe_env": os.environ.get("PROBE_VALUE"),
                "threads_env": os.environ.get("OMP_NUM_THREADS"),
                "cwd": os.getcwd(),
                "cpus": sorted(os.sched_getaffinity(0)),
                "umask": umask,
                "group_leader": os.getpgid(0) == os.getpid(),
                "imported_in": IMPORTED_IN,
                "pid": os.getpid(),
                "loaded": sorted(
                    name for name in ("deepspeed", "pipelinerl.workers.trainer") if name in sys.modules
                ),
            }
        )
    )
    print("to stdout")
    print("to stderr", file=sys.stderr)
    if action == ["raise"]:
        raise RuntimeError("the probe failed on purpose")
    if action == ["sleep"]:
        time.sleep(600)
    if action and action[0].startswith("exit:"):
        raise SystemExit(int(action[0].removeprefix("exit:")))
