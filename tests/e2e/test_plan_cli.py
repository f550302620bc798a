"""``pipelinerl plan`` as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.unit.plan.test_profile import profile_data

PIPELINERL = [sys.executable, "-m", "pipelinerl.cli"]
SMALL = ["-s", "run.max_steps=12", "-s", "rl.batch_size=16", "-s", "actor.max_in_flight=32"]


def plan(
    tmp_path: Path, *args: str, hardware: dict | None = None, **figures: float
) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / "profile.json"
    data = profile_data(**({"decode_base_s": 0.01, "train_base_s": 0.5, "transfer_s": 0.1} | figures))
    if hardware:
        data["hardware"] = hardware
    profile.write_text(json.dumps(data))
    return subprocess.run(
        [*PIPELINERL, "plan", "--profile", str(profile), *args], capture_output=True, text=True, timeout=120
    )


H100_SMALL = {
    "gpu": "H100",
    "gpus_per_engine": 1,
    "trainer_gpus": 4,
    "model_params_b": 0.5,
    "source": "a test",
}


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
        (
            ["--lengths", "fixed:20", "--modes", "pipeline,sync"],
            "mode sync: the modes planned are pipeline, conventional, async, colocated",
        ),
        (["--lengths", "fixed:20", "--cluster", "actors=8xH100,trainers=8xB300"], "unknown GPU 'B300'"),
        (["--lengths", "fixed:20", "--sweep", "actor_gpus=1..4"], "give the cluster it splits"),
        (["--lengths", "fixed:20", "-s", "rl.batch_size=7"], "rl.batch_size=7"),
    ]:
        done = plan(tmp_path, *args)
        assert done.returncode == 2, done.stdout
        assert named in done.stdout + done.stderr


def test_a_sweep_of_the_split_recommends_one_and_draws_it(tmp_path) -> None:
    """A cluster of 8 H100s split 1..7 ways. An engine writes 8 samples/s (32 sequences of 20 tokens at
    0.2 s a token); the trainer takes 16 in 0.1 + 2.56 / T s, and a 0.1 s transfer: about 8, 16, 22.5,
    19 and 15 samples/s at 1 to 5 actor GPUs. Few actor GPUs starve the trainer, few trainer GPUs make it
    the bottleneck; the recommended split is 3 actor GPUs, and the figure is written."""
    figure = tmp_path / "sweep.png"
    args = ["--lengths", "fixed:20", "--cluster", "actors=4xH100,trainers=4xH100", *SMALL]
    costs = {"decode_base_s": 0.2, "train_base_s": 0.1, "train_per_token_s": 0.002, "hardware": H100_SMALL}
    done = plan(tmp_path, *args, "--sweep", "actor_gpus=1..7", "--figure", str(figure), **costs)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recommended: actor_gpus=" in done.stdout
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    as_json = plan(tmp_path, *args, "--sweep", "actor_gpus=1..7", "--json", **costs)
    swept = json.loads(as_json.stdout)
    speeds = {point["value"]: point["runs"]["pipeline"]["samples_per_s"] for point in swept["points"]}
    assert swept["recommended"] == max(speeds, key=speeds.__getitem__)
    assert swept["recommended"] == 3, speeds
    assert speeds[3] > 1.2 * max(speeds[1], speeds[6]), speeds
    assert swept["points"][0]["cluster"] == "actors=1xH100,trainers=7xH100"


def test_a_sweep_of_a_setting_loads_the_config_at_each_value(tmp_path) -> None:
    done = plan(tmp_path, "--lengths", "fixed:20", *SMALL, "--sweep", "actor.max_in_flight=8,16,32", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [point["value"] for point in json.loads(done.stdout)["points"]] == [8, 16, 32]
    saved = plan(tmp_path, "--lengths", "fixed:20", *SMALL, f"--set=run.home={tmp_path / 'home'}", "--save")
    assert saved.returncode == 0 and "plan saved to" in saved.stdout, saved.stdout + saved.stderr
    (path,) = (tmp_path / "home" / "plans").glob("*-plan.json")
    assert set(json.loads(path.read_text())["runs"]) == {"pipeline", "conventional"}
    bad = plan(tmp_path, "--lengths", "fixed:20", *SMALL, "--sweep", "actor.max_in_flight=0,8")
    assert bad.returncode == 2 and "actor.max_in_flight" in bad.stdout + bad.stderr


def test_bench_plan_quick_times_every_case_and_records_it(tmp_path) -> None:
    """``pipelinerl bench plan --quick``: each case and mode simulated (their samples: steps x B), its
    CPU time recorded with the machine; the 10 s target is judged only at 1,000 steps."""
    out = tmp_path / "plan.json"
    done = subprocess.run(
        [*PIPELINERL, "bench", "plan", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(out.read_text())
    assert record["benchmark"] == "plan" and record["steps"] == 20 and record["targets"] == {}
    cases = {(row["case"], row["mode"]): row for row in record["rows"]}
    assert set(cases) == {
        (c, m) for c in ("48 actor GPUs", "128 actor GPUs") for m in ("pipeline", "conventional")
    }
    assert all(row["samples"] == 20 * 1024 and row["cpu_s"] > 0 for row in cases.values())
    assert cases[("128 actor GPUs", "pipeline")]["engines"] == 128
    assert "machine" in record and "| 48 actor GPUs | pipeline | 48 |" in done.stdout


def test_without_profile_or_lengths_the_cluster_picks_them_and_says_so() -> None:
    """The issue's form: `pipelinerl plan --config CONFIG --cluster ... [--sweep ...]`, no --profile."""
    command = [*PIPELINERL, "plan", "--cluster", "actors=96xH100,trainers=32xH100", "--json"]
    command += ["-s", "model.path=Qwen/Qwen2.5-7B-Instruct", "-s", "run.max_steps=8", "--modes", "pipeline"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["pipeline"]["samples_per_s"] > 0
    assert "profile: H100 and a 7B model: h100-7b" in done.stderr
    assert "lengths: the lengths h100-7b goes with: loglogistic:1000,3000" in done.stderr
    unknown = subprocess.run(
        [*PIPELINERL, "plan", "--cluster", "actors=8xL40S,trainers=8xL40S"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unknown.returncode == 2
    assert "no shipped profile describes L40S" in unknown.stdout + unknown.stderr
