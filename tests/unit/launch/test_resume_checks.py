"""What ``pipelinerl resume`` refuses before anything starts (``launch/resume.check_resumable``), on
run directories written here and real processes as their launchers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipelinerl.launch.resume import ResumeRefused, check_resumable, why_it_stopped
from pipelinerl.launch.run_state import LAUNCHER_FILE, write_launcher
from pipelinerl.platform.tracking.liveness import boot_id, start_ticks


def run_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "20261128-120000-pipeline-ab12"
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    return directory


def dead_launcher(directory: Path) -> None:
    """launcher.json of a process that has exited (its pid and start time no longer name a process)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = start_ticks(child.pid)
    child.wait()
    identity = {"host": socket.gethostname(), "boot_id": boot_id(), "pid": child.pid, "start_ticks": ticks}
    (directory / LAUNCHER_FILE).write_text(json.dumps(identity))


def test_a_directory_that_is_not_a_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ResumeRefused, match="is not a run directory"):
        check_resumable(tmp_path, stage_exit_timeout_s=0)


def test_a_run_whose_launcher_lives_is_refused_naming_its_pid(tmp_path: Path) -> None:
    directory = run_dir(tmp_path)
    write_launcher(directory)  # this test's process: alive
    with pytest.raises(
        ResumeRefused, match=r"is still running: its launcher, pid \d+ on this host, is alive"
    ):
        check_resumable(directory, stage_exit_timeout_s=0)


def test_a_finished_run_is_refused(tmp_path: Path) -> None:
    directory = run_dir(tmp_path)
    dead_launcher(directory)
    (directory / "summary.json").write_text("{}")
    with pytest.raises(ResumeRefused, match="finished .*nothing to resume"):
        check_resumable(directory, stage_exit_timeout_s=0)


def test_a_run_whose_stages_still_run_is_refused_naming_them(tmp_path: Path) -> None:
    directory = run_dir(tmp_path)
    dead_launcher(directory)
    stage = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "--run-dir", str(directory)]
    )
    try:
        with pytest.raises(ResumeRefused, match=rf"has stages still running \(pids {stage.pid}\)"):
            check_resumable(directory, stage_exit_timeout_s=0.5)
    finally:
        stage.kill()
        stage.wait()
    check_resumable(directory, stage_exit_timeout_s=0)  # its launcher gone and nothing left: resumable
    assert f"pid {json.loads((directory / LAUNCHER_FILE).read_text())['pid']}" in why_it_stopped(directory)
