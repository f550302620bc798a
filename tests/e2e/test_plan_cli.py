"""``pipelinerl plan`` as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.unit.plan.test_profile import profile_data

PIPELINERL = [sys.executable, "-m", "pipelinerl.cli"]
SMALL = ["-s", "run.max_steps=12", "-s", "rl.batch_size=16", "-s", "actor.max_in_flight=32"]


def plan(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(profile_data(decode_base_s=0.01, train_base_s=0.5, transfer_s=0.1)))
    return subprocess.run(
        [*PIPELINERL, "plan", "--profile", str(profile), *args], capture_output=True, text=True, timeout=120
    )


def test_plan_prints_each_mode_and_the_speed_up(tmp_path) -> None:
    done = plan(tmp_path, "--lengths", "lognormal:40,80", *SMALL)
    assert done.returncode == 0, done.stderr
    assert "pipeline" in done.stdout and "conventional" in done.stdout
    assert "pipeline / conventional:" in done.stdout


def test_plan_json_has_the_figures_of_every_mode(tmp_path) -> None:
    done = plan(tmp_path, "--lengths", "fixed:20", "--json", "--modes", "pipeline", *SMALL)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert set(figures) == {"pipeline"}
    assert figures["pipeline"]["samples_per_s"] > 0
    assert sum(figures["pipeline"]["lag_tokens"].values()) == 12 * 16 * 20


def test_bad_input_is_one_line_naming_it(tmp_path) -> None:
    for args, named in [
        (["--lengths", "uniform:3"], "lengths 'uniform:3'"),
        (["--lengths", "fixed:20", "--modes", "pipeline,async"], "mode 'async' is not simulated yet"),
        (["--lengths", "fixed:20", "-s", "rl.batch_size=7"], "rl.batch_size=7"),
    ]:
        done = plan(tmp_path, *args)
        assert done.returncode == 2, done.stdout
        assert named in done.stdout + done.stderr
