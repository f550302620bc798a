"""Which stages each role's node runs (``workers/stages.py``), and the config checks behind it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelinerl.platform.config import ConfigError, load_config
from pipelinerl.workers.stages import assignment, build_stages


def config(*overrides: str):
    return load_config(None, list(overrides))


def test_one_machine_runs_every_stage():
    share = assignment(config("trainer.num_processes=2", "actor.num_actors=3", "rl.batch_size=32"))
    assert share.stage_names() == ["trainer0", "trainer1", "preprocessor", "actor0", "actor1", "actor2"]


def test_roles_split_over_their_nodes():
    split = config(
        "trainer.num_processes=4",
        "rl.batch_size=32",
        "actor.num_actors=4",
        "cluster.trainer_nodes=2",
        "cluster.actor_nodes=2",
    )
    assert assignment(split, "trainer", 0).stage_names() == ["trainer0", "trainer1", "preprocessor"]
    assert assignment(split, "trainer", 1).stage_names() == ["trainer2", "trainer3"]
    assert assignment(split, "actor", 0).stage_names() == ["actor0", "actor1"]
    assert assignment(split, "actor", 1).stage_names() == ["actor2", "actor3"]
    every = [
        name
        for role in ("trainer", "actor")
        for node in (0, 1)
        for name in assignment(split, role, node).stage_names()
    ]
    assert sorted(every) == sorted(assignment(split).stage_names()), "each stage on exactly one node"


def test_a_node_outside_the_role_is_named():
    with pytest.raises(ValueError, match=r"node 2 is outside 0..1 \(cluster.actor_nodes=2\)"):
        assignment(config("actor.num_actors=2", "cluster.actor_nodes=2"), "actor", 2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["actor.num_actors=3", "cluster.actor_nodes=2"],
            "actor.num_actors=3 must divide evenly over cluster.actor_nodes=2",
        ),
        (
            ["trainer.num_processes=2", "rl.batch_size=32", "cluster.trainer_nodes=4"],
            "trainer.num_processes=2 must divide evenly over cluster.trainer_nodes=4",
        ),
        (["cluster.placement=slurm"], "cluster.placement"),
        (["cluster.actor_deployment=rl-role"], "cluster.actor_deployment"),
    ],
)
def test_bad_cluster_settings_fail_naming_them(overrides, message):
    with pytest.raises(ConfigError, match=message):
        config(*overrides)


def test_a_second_trainer_node_gets_global_ranks_and_local_ranks(tmp_path: Path):
    split = config("trainer.num_processes=4", "rl.batch_size=32", "cluster.trainer_nodes=2")
    stages = build_stages(split, tmp_path, tmp_path / "model", "trainer", 1)
    assert [s.name for s in stages] == ["trainer2", "trainer3"]
    assert [(s.env["RANK"], s.env["LOCAL_RANK"], s.env["WORLD_SIZE"]) for s in stages] == [
        ("2", "0", "4"),
        ("3", "1", "4"),
    ]
    assert all(s.env["MASTER_PORT"] == str(split.transport.port("trainer_dist")) for s in stages)


def test_the_actor_interpreter_must_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import sys

    from pipelinerl.workers import stages
    from pipelinerl.workers.launcher import check_actor_interpreter

    check_actor_interpreter(config())  # this interpreter
    with pytest.raises(ConfigError, match="actor.python='/nowhere/python' does not exist"):
        check_actor_interpreter(config("actor.python=/nowhere/python"))
    monkeypatch.setattr(stages, "vllm_python", lambda: tmp_path / ".venv-vllm" / "bin" / "python")
    vllm = config("actor.engine=vllm")
    assert stages.actor_interpreter(vllm) == str(tmp_path / ".venv-vllm" / "bin" / "python")
    with pytest.raises(ConfigError, match="make vllm-env"):
        check_actor_interpreter(vllm)
    assert (
        stages.actor_interpreter(config("actor.engine=vllm", f"actor.python={sys.executable}"))
        == sys.executable
    )
