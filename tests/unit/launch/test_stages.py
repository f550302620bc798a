"""Which stages each role's node runs (``launch/stages.py``), and the config checks behind it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pipelinerl.launch import stages as stages_module
from pipelinerl.launch.actor_env import check_actor_interpreter, vllm_release
from pipelinerl.launch.preflight import check_cpus
from pipelinerl.launch.stages import Stage, StallWatch, assignment, build_stages
from pipelinerl.platform.config import ConfigError, load_config


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
    check_actor_interpreter(config())  # this interpreter
    with pytest.raises(ConfigError, match="actor.python='/nowhere/python' does not exist"):
        check_actor_interpreter(config("actor.python=/nowhere/python"))
    monkeypatch.setattr(stages_module, "vllm_python", lambda: tmp_path / ".venv-vllm" / "bin" / "python")
    vllm = config("actor.engine=vllm")
    assert stages_module.actor_interpreter(vllm) == str(tmp_path / ".venv-vllm" / "bin" / "python")
    with pytest.raises(ConfigError, match="make vllm-env"):
        check_actor_interpreter(vllm)
    assert (
        stages_module.actor_interpreter(config("actor.engine=vllm", f"actor.python={sys.executable}"))
        == sys.executable
    )


def test_actor_and_trainer_cores(tmp_path: Path):
    pinned = config("actor.cpus=[0]", "trainer.cpus=[1]")
    stages = {s.name: s.cpus for s in build_stages(pinned, tmp_path, tmp_path / "model")}
    assert stages == {"trainer0": (1,), "preprocessor": (1,), "actor0": (0,)}
    assert all(s.cpus == () for s in build_stages(config(), tmp_path, tmp_path / "model"))
    missing = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(
        ConfigError, match=rf"actor.cpus=\[{missing}\]: core\(s\) \[{missing}\] are not available"
    ):
        check_cpus(config(f"actor.cpus=[{missing}]"))
    with pytest.raises(ConfigError, match="trainer.cpus"):
        config("trainer.cpus=[-1]")


def test_a_pinned_stage_runs_on_its_core(tmp_path: Path):
    core = min(os.sched_getaffinity(0))
    stage = Stage(
        "probe",
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        dict(os.environ),
        tmp_path / "probe.log",
        (core,),
    )
    stage.start(cwd=tmp_path)
    assert stage.process is not None and stage.process.wait(timeout=30) == 0
    assert stage.log_path.read_text().strip() == f"[{core}]"


def test_the_stall_watch_counts_from_the_last_new_version_and_names_it():
    watch = StallWatch(timeout_s=60, started=1000.0, first_step_timeout_s=300)
    watch.observe(3, 1050.0)
    watch.observe(3, 1100.0)  # the same version again is no progress
    assert watch.stalled_for(1100.0) is None and watch.stalled_for(1111.0) == 61.0
    described = watch.describe(61.0)
    assert "no optimizer step for 61 s since policy version 3 (run.stall_timeout_s=60)" in described
    assert StallWatch(timeout_s=0, started=0.0).stalled_for(10**9) is None


def test_the_first_step_has_the_start_budget():
    """Loading the model and starting the engines count against run.first_step_timeout_s, not the stall's."""
    watch = StallWatch(timeout_s=60, started=1000.0, first_step_timeout_s=300)
    assert watch.stalled_for(1299.0) is None, "past the stall timeout, within the start budget"
    assert watch.stalled_for(1301.0) == 301.0
    assert "301 s since the stages started (run.first_step_timeout_s=300)" in watch.describe(301.0)
    assert StallWatch(timeout_s=60, started=0.0, first_step_timeout_s=0).stalled_for(10**9) is None


def test_a_restarted_attempt_starts_again_from_its_checkpoint_version():
    """After a restart from v6 the stages start again: v6 read back is not progress, v7 is."""
    watch = StallWatch(timeout_s=60, started=1000.0, first_step_timeout_s=300, start_version=6)
    watch.observe(6, 1010.0)
    assert watch.stalled_for(1200.0) is None and not watch.started_up
    watch.observe(7, 1250.0)
    assert watch.stalled_for(1309.0) is None and watch.stalled_for(1311.0) == 61.0


def fake_python(directory: Path, prints: str, code: int = 0) -> str:
    """An "interpreter" that answers the vLLM version probe with ``prints`` and exits with ``code``."""
    path = directory / "python"
    path.write_text(f"#!/bin/sh\necho '{prints}'\nexit {code}\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(
    ("prints", "code", "message"),
    [
        ("0.25.1", 0, r"has vllm 0\.25\.1; the engine needs vllm 0\.26 or newer"),
        ("", 0, "has no vllm installed"),
        ("", 1, "has no vllm installed"),
        ("nonsense", 0, "has vllm nonsense"),
    ],
)
def test_a_vllm_release_the_engine_cannot_run_is_refused_naming_it(tmp_path: Path, prints, code, message):
    python = fake_python(tmp_path, prints, code)
    with pytest.raises(ConfigError, match=message):
        check_actor_interpreter(config("actor.engine=vllm", f"actor.python={python}"))


@pytest.mark.parametrize("version", ["0.26.0", "0.27.0+cpu", "0.32.0", "0.32.0+cpu", "0.40.1", "1.0.0"])
def test_supported_vllm_releases_pass(tmp_path: Path, version: str):
    check_actor_interpreter(config("actor.engine=vllm", f"actor.python={fake_python(tmp_path, version)}"))
    assert vllm_release(version) is not None


def test_the_vllm_environment_this_checkout_builds_passes():
    if not stages_module.vllm_python().is_file():
        pytest.skip("no .venv-vllm here (make vllm-env builds it; make test does)")
    check_actor_interpreter(config("actor.engine=vllm"))
    oldest = stages_module.vllm_python().parents[2] / ".venv-vllm-oldest" / "bin" / "python"
    if oldest.is_file():  # the oldest supported release this machine installs (make vllm-env-oldest)
        check_actor_interpreter(config("actor.engine=vllm", f"actor.python={oldest}"))
