"""``deepspeed_setup.leave_distributed``: the ranks leave their group together, and a rank that has none
has nothing to leave."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from pipelinerl.workers.deepspeed_setup import leave_distributed
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[3]

TWO_RANKS = textwrap.dedent(
    """
    import sys, datetime
    import torch.distributed as dist
    from pipelinerl.workers.deepspeed_setup import leave_distributed
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    leave_distributed()
    print("left", dist.is_initialized(), flush=True)
    """
)


def test_two_gloo_ranks_leave_their_group_and_exit_cleanly() -> None:
    port = free_port()
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", TWO_RANKS, str(rank), str(port)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    for rank in ranks:
        out, err = rank.communicate(timeout=120)
        assert rank.returncode == 0, err
        assert out.strip() == "left False"
        assert "destroy_process_group() was not called" not in err


def test_without_a_group_there_is_nothing_to_leave() -> None:
    leave_distributed()
