"""The trainer ranks' environment against what real torchrun agents give their workers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipelinerl.launch.rank_env import torchrun_env
from pipelinerl.launch.stages import build_stages
from pipelinerl.platform.config import load_config
from pipelinerl.platform.config.infrastructure import PORTS
from tests.conftest import free_port

# Each process writes its environment to a file of its own (named by its RANK): two workers of one agent
# share its stdout, and printed lines of a few KB interleaved there (CI saw two on one line).
PROBE = """
import json, os, sys
with open(os.path.join(sys.argv[1], "env-" + os.environ.get("RANK", "none") + ".json"), "w") as out:
    json.dump(dict(os.environ), out)
"""


def probe_env(tmp_path: Path, rank: str) -> dict[str, str]:
    return json.loads((tmp_path / "envs" / f"env-{rank}.json").read_text())


def torchrun_workers(tmp_path: Path, nodes: int, per_node: int, port: int) -> dict[int, dict[str, str]]:
    """What torchrun adds to each worker's environment, by RANK: ``nodes`` real agents on this machine."""
    probe, envs = tmp_path / "probe.py", tmp_path / "envs"
    probe.write_text(PROBE)
    envs.mkdir()
    baseline_run = [sys.executable, str(probe), str(envs)]
    done = subprocess.run(baseline_run, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    baseline = probe_env(tmp_path, "none")
    agents = [
        subprocess.Popen(
            [
                *[sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes)],
                *["--nproc-per-node", str(per_node), "--node-rank", str(node), "--rdzv-backend", "static"],
                *["--master-addr", "127.0.0.1", "--master-port", str(port), "--role", "trainer"],
                *[str(probe), str(envs)],
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in range(nodes)
    ]
    for agent in agents:
        out, _ = agent.communicate(timeout=120)
        assert agent.returncode == 0, out
    workers = {}
    for rank in range(nodes * per_node):
        env = probe_env(tmp_path, str(rank))
        workers[rank] = {n: v for n, v in env.items() if baseline.get(n) != v}
    return workers


@pytest.mark.parametrize(("nodes", "per_node"), [(1, 2), (2, 1)])
def test_the_launcher_gives_each_rank_what_torchrun_gives_it(tmp_path, nodes, per_node):
    """The launcher's trainer stages against torchrun's workers for the same placement: every variable
    torchrun sets is set alike, but for the agent's own (``TORCHELASTIC_*``: its store, error files,
    restarts, which the launcher does itself) and the thread count (``trainer.torch_threads``)."""
    master_port = free_port()  # the agents' store binds it: one the kernel has just found free
    config = load_config(
        None,
        [
            f"trainer.num_processes={nodes * per_node}",
            f"cluster.trainer_nodes={nodes}",
            "rl.batch_size=32",
            "transport.host=127.0.0.1",
            f"transport.base_port={master_port - PORTS.index('trainer_dist')}",
        ],
    )
    assert config.transport.port("trainer_dist") == master_port
    workers = torchrun_workers(tmp_path, nodes, per_node, master_port)
    assert sorted(workers) == list(range(nodes * per_node))
    role = "trainer" if nodes > 1 else None  # one node: the local launch of every stage
    stages = [
        stage
        for node in range(nodes)
        for stage in build_stages(config, tmp_path, tmp_path / "model", role, node)
        if stage.name.startswith("trainer")
    ]
    assert [stage.name for stage in stages] == [f"trainer{rank}" for rank in range(nodes * per_node)]
    for rank, stage in enumerate(stages):
        torchrun = {
            name: value
            for name, value in workers[rank].items()
            if not name.startswith("TORCHELASTIC_") and name != "OMP_NUM_THREADS"
        }
        assert torchrun, "torchrun placed its workers"
        assert {name: stage.env.get(name) for name in torchrun} == torchrun, stage.name


def test_the_placement_is_pure_and_checked():
    assert torchrun_env(3, 2, 2, "10.0.0.1", 29500) == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_NAME": "trainer",
        "ROLE_RANK": "3",
        "ROLE_WORLD_SIZE": "4",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    }
    with pytest.raises(ValueError, match="rank 2 is outside 0..1"):
        torchrun_env(2, 2, 1, "127.0.0.1", 29500)
    with pytest.raises(ValueError, match="at least one node of one rank"):
        torchrun_env(0, 0, 1, "127.0.0.1", 29500)
