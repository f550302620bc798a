"""Cost profiles, lengths given on the command line, and the workload a config asks for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipelinerl.plan.costs import CostModel
from pipelinerl.plan.from_config import workload_from_config
from pipelinerl.plan.lengths import FixedLengths, LogLogisticLengths, LogNormalLengths, parse_lengths
from pipelinerl.plan.profile import FIGURES, ProfileError, load_profile
from pipelinerl.platform.config import load_config


def profile_data(**values: float) -> dict:
    figures = {name: {"value": values.get(name, 0.0), "unit": "s", "source": "a test"} for name in FIGURES}
    figures["decode_base_s"]["value"] = values.get("decode_base_s", 0.01)
    return {"name": "test", "figures": figures}


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return path


def test_a_profile_gives_its_cost_model(tmp_path) -> None:
    profile = load_profile(write(tmp_path, profile_data(transfer_s=2.5)))
    assert profile.cost_model() == CostModel(decode_base_s=0.01, transfer_s=2.5)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda d: d["figures"].pop("transfer_s"), "missing figure transfer_s"),
        (
            lambda d: d["figures"].update(warp_s={"value": 1, "unit": "s", "source": "x"}),
            "unknown figure warp_s",
        ),
        (lambda d: d["figures"]["transfer_s"].update(value=-1), "figures.transfer_s.value"),
        (lambda d: d["figures"]["transfer_s"].pop("source"), "figures.transfer_s.source"),
        (lambda d: d["figures"]["decode_base_s"].update(value=0), "decode_base_s"),
    ],
)
def test_a_bad_profile_names_what_is_wrong(tmp_path, change, named) -> None:
    data = profile_data()
    change(data)
    with pytest.raises(ProfileError, match=named):
        load_profile(write(tmp_path, data))


def test_an_unreadable_or_malformed_profile_names_the_file(tmp_path) -> None:
    with pytest.raises(ProfileError, match="cannot be read"):
        load_profile(tmp_path / "absent.json")
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ProfileError, match=f"profile {path}: not JSON"):
        load_profile(path)


def test_lengths_from_the_command_line() -> None:
    assert parse_lengths("fixed:300", 8192) == FixedLengths(300)
    assert parse_lengths("fixed:9000", 8192) == FixedLengths(8192)  # a run cuts at max_new_tokens
    lognormal = parse_lengths("lognormal:1000,2000", 8192)
    assert isinstance(lognormal, LogNormalLengths) and lognormal.max_tokens == 8192
    for bad in ("fixed", "fixed:1.5", "uniform:3", "lognormal:1000", "fixed:x"):
        with pytest.raises(ValueError, match=f"lengths '{bad}'"):
            parse_lengths(bad, 8192)


def test_the_workload_of_a_config() -> None:
    config = load_config(
        None,
        [
            "run.mode=conventional",
            "run.steps_per_round=8",
            "run.train_during_round=false",
            "rl.batch_size=64",
            "rl.group_size=8",
            "actor.num_actors=3",
            "actor.max_in_flight=128",
            "transport.queue_size=32",
        ],
    )
    workload = workload_from_config(config, FixedLengths(10), prompt_tokens=50)
    assert (workload.mode, workload.engines, workload.in_flight, workload.batch_size) == (
        "conventional",
        3,
        128,
        64,
    )
    assert (workload.steps_per_round, workload.train_during_round, workload.steps) == (
        8,
        False,
        config.run.max_steps,
    )
    # the socket's 32 and batches_ahead (2) + G - 1 batches: more than the round of 512 it waits for
    assert workload.queue_capacity == 32 + (2 + 7) * 64
    pipeline = workload_from_config(config, FixedLengths(10), prompt_tokens=50, mode="pipeline")
    assert pipeline.mode == "pipeline" and pipeline.steps_per_round == 1
    drained = workload_from_config(config, FixedLengths(10), prompt_tokens=50, mode="async")
    assert (drained.mode, drained.drain_lag, drained.recompute) == (
        "async",
        config.run.async_drain_lag,
        False,
    )
    with pytest.raises(ValueError, match="mode 'sync': the simulator models pipeline, conventional, async"):
        workload_from_config(config, FixedLengths(10), prompt_tokens=50, mode="sync")


def test_a_loglogistic_has_its_median_and_p90_and_a_heavier_tail_than_a_lognormal() -> None:
    heavy = parse_lengths("loglogistic:1000,3000", 10**9)
    assert isinstance(heavy, LogLogisticLengths) and heavy.longest == 10**9
    drawn = heavy.sample(np.random.default_rng(0), 400_000)
    assert np.median(drawn) == pytest.approx(1000, rel=0.02)
    assert np.percentile(drawn, 90) == pytest.approx(3000, rel=0.02)
    # a lognormal of the same median and p90 has a far lighter tail: its p99.9 is well below
    sigma = np.log(3.0) / 1.2815515655446004
    light = np.random.default_rng(0).lognormal(np.log(1000), sigma, 400_000)
    assert np.percentile(drawn, 99.9) > 2 * np.percentile(light, 99.9)
    assert parse_lengths("loglogistic:1000,3000", 8192).sample(np.random.default_rng(0), 10_000).max() == 8192
    with pytest.raises(ValueError, match="need 0 < median < p90"):
        parse_lengths("loglogistic:3000,1000", 8192)


def test_the_shipped_gpu_profiles_are_what_their_script_derives() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/gpu_profiles.py", "--check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_a_decode_table_replaces_the_straight_line_and_reads_between_its_points() -> None:
    table = ((16, 0.007), (32, 0.0095), (64, 0.020))
    costs = CostModel(decode_base_s=1.0, decode_per_context_token_s=1e-6, decode_table=table)
    assert costs.decode_step_s(32, 0) == pytest.approx(0.0095)  # measured: the base is not read
    assert costs.decode_step_s(48, 0) == pytest.approx(0.01475)  # halfway between 32 and 64
    assert costs.decode_step_s(80, 0) == pytest.approx(0.020 + 16 * 0.0105 / 32)  # the last segment on
    assert costs.decode_step_s(8, 0) == pytest.approx(0.007 - 8 * 0.0025 / 16)  # the first segment back
    assert costs.decode_step_s(1, 0) >= 0.007 / 16  # never below the first point scaled down by H
    assert costs.decode_step_s(32, 1000) == pytest.approx(0.0095 + 1e-3)  # context still costs
    assert costs.decode_steps_s(3, 32, 0) == pytest.approx(3 * 0.0095 + 1e-6 * 32 * (0 + 1 + 2))  # grows


@pytest.mark.parametrize(
    ("table", "named"),
    [
        (((32, 0.01),), "2 or more points"),
        (((32, 0.01), (16, 0.02)), "H must ascend"),
        (((0, 0.01), (16, 0.02)), "point 0"),
        (((8, 0.01), (16, 0.0)), "point 1"),
    ],
)
def test_a_bad_decode_table_is_refused_naming_the_point(table, named) -> None:
    with pytest.raises(ValueError, match=named):
        CostModel(decode_base_s=0.01, decode_table=table)


def test_a_profile_carries_its_decode_table_into_the_cost_model(tmp_path) -> None:
    data = json.loads((Path(__file__).parents[3] / "pipelinerl/plan/profiles/cpu-2core.json").read_text())
    data["decode_table"] = {"points": [[8, 0.004], [32, 0.01]], "source": "bench decode, a test"}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    assert load_profile(path).cost_model().decode_table == ((8, 0.004), (32, 0.01))
    data["decode_table"]["points"] = [[32, 0.01], [8, 0.004]]
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="H must ascend"):
        load_profile(path)
