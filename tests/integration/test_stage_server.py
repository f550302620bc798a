"""Stages forked from a stage server (``launch/stage_server.py``), for real: a server process that has
imported a stand-in stage's module (``tests/stage_probe.py``, with torch) forks that stage, which
must run as ``python -m`` would have run it: its arguments, environment, directory, cores, umask, own
process group and log, its command line in ``/proc``; exit codes and signals as ``Popen`` reports them;
and nothing left when the server ends."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from pipelinerl.launch.stage_server import ForkedProcess, server_for
from pipelinerl.launch.stages import STAGE_UMASK, Stage, stage_env
from pipelinerl.platform.curve_keys import PRIVATE_FILE_MODE
from tests.conftest import wait_until

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def probe(tmp_path: Path, name: str, *action: str, env: dict[str, str] | None = None, cpus=()) -> Stage:
    command = [sys.executable, "-m", "tests.stage_probe", str(tmp_path / f"{name}.json"), *action]
    return Stage(
        name, command, {**stage_env(1), **(env or {})}, tmp_path / "logs" / f"{name}.log", cpus, True
    )


def report(tmp_path: Path, name: str) -> dict:
    return json.loads((tmp_path / f"{name}.json").read_text())


def test_a_forked_stage_runs_as_python_m_would_have(tmp_path: Path) -> None:
    core = min(os.sched_getaffinity(0))
    stage = probe(tmp_path, "probe", env={"PROBE_VALUE": "seen", "OMP_NUM_THREADS": "1"}, cpus=(core,))
    stage.start(cwd=tmp_path)
    assert isinstance(stage.process, ForkedProcess)
    assert stage.process.wait(timeout=180) == 0, stage.log_tail()
    seen = report(tmp_path, "probe")
    assert seen["sys_argv"][0].endswith("stage_probe.py")
    assert seen["sys_argv"][1:] == [str(tmp_path / "probe.json")]
    assert seen["probe_env"] == "seen" and seen["threads_env"] == "1"
    assert seen["cwd"] == str(tmp_path)
    assert seen["cpus"] == [core]
    assert seen["umask"] == STAGE_UMASK
    assert seen["group_leader"], "its own process group, as start_new_session gives"
    assert seen["imported_in"] != seen["pid"], "forked after the server imported the stage's module"
    log = stage.log_path.read_text()
    assert "to stdout" in log and "to stderr" in log
    assert stage.log_path.stat().st_mode & 0o777 == PRIVATE_FILE_MODE


def test_its_command_line_is_the_stage_s_and_a_signal_is_its_exit_code(tmp_path: Path) -> None:
    stage = probe(tmp_path, "sleeper", "sleep")
    stage.start(cwd=tmp_path)
    assert stage.process is not None
    wait_until(lambda: (tmp_path / "sleeper.json").exists(), 180, "the stage started")
    argv = Path(f"/proc/{stage.process.pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
    assert argv == stage.command, "ps, pgrep -f and psutil see what the stage would have run as"
    assert "tests.stage_probe" in psutil.Process(stage.process.pid).cmdline()
    environ = Path(f"/proc/{stage.process.pid}/environ").read_bytes().rstrip(b"\0").decode().split("\0")
    assert environ == [f"{key}={value}" for key, value in stage.env.items()], "its own environment"
    assert stage.exit_code() is None
    stage.signal_group(signal.SIGTERM)
    assert stage.process.wait(timeout=60) == -signal.SIGTERM


@pytest.mark.parametrize(("action", "code"), [("exit:3", 3), ("raise", 1)])
def test_an_exit_code_and_a_traceback_reach_the_launcher_and_the_log(tmp_path: Path, action, code) -> None:
    stage = probe(tmp_path, "failing", action)
    stage.start(cwd=tmp_path)
    assert stage.process is not None and stage.process.wait(timeout=180) == code
    if action == "raise":
        assert "RuntimeError: the probe failed on purpose" in stage.log_path.read_text()


def test_a_server_imports_only_what_its_stages_run_and_each_module_once(tmp_path: Path) -> None:
    """A launcher whose node runs no trainer (an actors' pool node) loads no DeepSpeed in its server;
    a second stage of the same module forks from the server that imported it for the first."""
    alone = {"PROBE_VALUE": f"alone-{tmp_path.name}"}  # an environment no other test's server has
    first, second = probe(tmp_path, "first", env=alone), probe(tmp_path, "second", env=alone)
    for stage in (first, second):
        stage.start(cwd=tmp_path)
        assert stage.process is not None and stage.process.wait(timeout=180) == 0, stage.log_tail()
    seen_first, seen_second = report(tmp_path, "first"), report(tmp_path, "second")
    assert seen_first["loaded"] == [], "neither the trainer's module nor DeepSpeed in the server"
    assert seen_first["imported_in"] == seen_second["imported_in"] != seen_second["pid"]


def test_stages_share_a_server_unless_their_environment_differs_beyond_their_own_variables() -> None:
    base = stage_env(1)
    server = server_for(sys.executable, base)
    own = {"OMP_NUM_THREADS": "4", "RANK": "1", "PYTEST_CURRENT_TEST": "another test"}
    assert server_for(sys.executable, {**base, **own}) is server
    other = server_for(
        sys.executable, {**base, "HF_HUB_OFFLINE": "1" if base.get("HF_HUB_OFFLINE") != "1" else "0"}
    )
    assert other is not server, "a library may have read it at import: another server"
    assert not server.alive, "the idle server of the other environment is not kept beside it"
    other.close()


def test_a_server_that_ends_takes_its_stages_with_it(tmp_path: Path) -> None:
    env = {"PROBE_VALUE": "own server"}  # a server of its own, closed below
    stage = probe(tmp_path, "orphan", "sleep", env=env)
    stage.start(cwd=tmp_path)
    assert stage.process is not None
    wait_until(lambda: (tmp_path / "orphan.json").exists(), 180, "the stage started")
    server = server_for(sys.executable, stage.env)
    server.close()
    assert not server.alive
    wait_until(lambda: stage.exit_code() is not None, 60, "the stage ended with its server")
    assert not psutil.pid_exists(stage.process.pid) or psutil.Process(stage.process.pid).status() == "zombie"
