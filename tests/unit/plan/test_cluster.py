"""Planning for a cluster: reading it, checking it holds the model, scaling a GPU profile to it, the
sweep of one setting and its recommendation (``plan/cluster.py``, ``plan/predict.py``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipelinerl.plan.cluster import Cluster, ClusterError, check_fits, parse_cluster, scaled_costs
from pipelinerl.plan.costs import CostModel
from pipelinerl.plan.from_config import workload_from_config
from pipelinerl.plan.lengths import FixedLengths
from pipelinerl.plan.predict import parse_sweep, predict, recommend, sweep_points
from pipelinerl.plan.profile import CostProfile, Hardware, ProfileError, resolve_profile, shipped_profiles
from pipelinerl.plan.simulate import simulate
from pipelinerl.platform.config import load_config
from tests.unit.plan.test_profile import profile_data

HARDWARE = Hardware(gpu="H100", gpus_per_engine=2, trainer_gpus=4, model_params_b=7.0, source="a test")


def gpu_profile(**values: float) -> CostProfile:
    return CostProfile.model_validate({**profile_data(**values), "hardware": HARDWARE.model_dump()})


def test_a_cluster_is_read_with_its_gpu_named_as_known() -> None:
    assert parse_cluster("actors=96xH100,trainers=32xH100") == Cluster(96, 32, "H100")
    assert parse_cluster("trainers=8xh200, actors=8xh200") == Cluster(8, 8, "H200")
    assert str(Cluster(96, 32, "H100")) == "actors=96xH100,trainers=32xH100"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("actors=8xB300,trainers=8xB300", "unknown GPU 'B300'; the GPUs known are H100, H200"),
        ("actors=8xH100", "trainers missing"),
        ("actors=8xH100,trainers=8xH200", "actors on H100, trainers on H200"),
        ("actors=0xH100,trainers=8xH100", "actors=0xH100: at least 1 GPU"),
        ("actors:8,trainers:8", "cannot read 'actors:8'"),
        ("actors=8xH100,actors=8xH100", "actors given twice"),
    ],
)
def test_a_bad_cluster_is_refused_naming_it(text: str, named: str) -> None:
    with pytest.raises(ClusterError, match=named):
        parse_cluster(text)


def test_a_cluster_that_cannot_hold_the_model_is_refused_before_simulating() -> None:
    check_fits(HARDWARE, Cluster(8, 4, "H100"))
    with pytest.raises(ClusterError, match="an engine takes 2 GPUs"):
        check_fits(HARDWARE, Cluster(7, 4, "H100"))
    with pytest.raises(ClusterError, match=r"at least 2 trainer GPUs"):  # 16 B x 7e9 = 112 GB; 0.7 x 80 a GPU
        check_fits(HARDWARE, Cluster(8, 1, "H100"))
    huge = HARDWARE.model_copy(update={"model_params_b": 100.0})
    with pytest.raises(ClusterError, match="bf16 weights .* do not fit an engine of 2xH100"):
        check_fits(huge, Cluster(8, 64, "H100"))
    with pytest.raises(ClusterError, match="profile measured on H100"):
        check_fits(HARDWARE, Cluster(8, 4, "H200"))
    with pytest.raises(ClusterError, match="the cluster has 12 GPUs; between 1 and 11 act"):
        Cluster(8, 4, "H100").with_actor_gpus(12)


def test_trainer_costs_scale_with_its_gpus_and_the_engines_with_the_actor_gpus() -> None:
    costs = CostModel(decode_base_s=0.01, train_base_s=1.0, train_per_token_s=0.4, train_per_sequence_s=0.2)
    doubled = scaled_costs(costs, HARDWARE, Cluster(8, 8, "H100"))
    assert (doubled.train_base_s, doubled.train_per_token_s, doubled.train_per_sequence_s) == (1.0, 0.2, 0.1)
    assert doubled.decode_base_s == costs.decode_base_s and doubled.transfer_s == costs.transfer_s
    # On the cluster, the run is the config's with 6 / 2 = 3 engines and the trainer's costs halved.
    config = load_config(None, ["rl.batch_size=8", "rl.group_size=2", "run.max_steps=6"])
    profile = gpu_profile(decode_base_s=0.01, train_base_s=0.1, train_per_token_s=0.002)
    planned = predict(config, profile, FixedLengths(30), ["pipeline"], 20, Cluster(6, 8, "H100"))["pipeline"]
    workload = replace(workload_from_config(config, FixedLengths(30), 20, "pipeline"), engines=3)
    by_hand = simulate(workload, replace(profile.cost_model(), train_per_token_s=0.001))
    assert planned == by_hand


def test_the_colocated_baseline_generates_then_trains_on_every_gpu() -> None:
    config = load_config(
        None, ["rl.batch_size=8", "rl.group_size=2", "run.max_steps=4", "run.steps_per_round=2"]
    )
    profile = gpu_profile(decode_base_s=0.01, train_base_s=0.1, train_per_token_s=0.002)
    planned = predict(config, profile, FixedLengths(30), ["colocated"], 20, Cluster(6, 2, "H100"))[
        "colocated"
    ]
    workload = workload_from_config(config, FixedLengths(30), 20, "conventional")
    workload = replace(workload, engines=4, train_during_round=False)
    assert planned == simulate(workload, replace(profile.cost_model(), train_per_token_s=0.001))
    with pytest.raises(ValueError, match="mode colocated: .* give --cluster"):
        predict(config, profile, FixedLengths(30), ["colocated"], 20)
    with pytest.raises(
        ValueError, match="mode sync: the modes planned are pipeline, conventional, async, colocated"
    ):
        predict(config, profile, FixedLengths(30), ["sync"], 20)


def test_a_profile_without_hardware_cannot_be_scaled_to_a_cluster() -> None:
    config = load_config(None, [])
    plain = CostProfile.model_validate(profile_data())
    with pytest.raises(ClusterError, match="--cluster needs a GPU profile"):
        predict(config, plain, FixedLengths(10), ["pipeline"], 10, Cluster(2, 2, "H100"))


def test_sweeps_are_read_as_ranges_or_lists() -> None:
    assert parse_sweep("actor_gpus=64..112:16").values == (64, 80, 96, 112)
    assert parse_sweep("actor.max_in_flight=16,32").values == (16, 32)
    assert parse_sweep("rl.max_lag=1..3").values == (1, 2, 3)
    for bad, named in [
        ("actor_gpus", "expected NAME=LOW..HIGH:STEP"),
        ("gpus=1..4", "neither actor_gpus nor a setting"),
        ("actor_gpus=8..4", "LOW <= HIGH"),
        ("actor_gpus=a,b", "whole numbers expected"),
        ("actor_gpus=1..1000", "at most 256"),
        ("actor_gpus=1..1000000000000000", "1000000000000000 values; at most 256"),
    ]:
        with pytest.raises(ValueError, match=named):
            parse_sweep(bad)


def test_the_recommended_split_is_the_fastest_and_the_reason_names_its_neighbours() -> None:
    """An engine of 2 GPUs writes 32 sequences of 20 tokens in 4 s (8 samples/s); the trainer takes
    16 samples in 0.1 + 2.56 x 4 / T s. On 12 GPUs: 2 actor GPUs starve the trainer, 10 leave it the
    bottleneck; the best split is between, with the trainer waiting below it and the actors above."""
    config = load_config(
        None, ["rl.batch_size=16", "actor.max_in_flight=32", "run.max_steps=12", "trainer.zero_stage=3"]
    )
    profile = gpu_profile(decode_base_s=0.2, train_base_s=0.1, train_per_token_s=0.008)
    cluster = Cluster(6, 6, "H100")
    points = list(
        sweep_points(
            parse_sweep("actor_gpus=2..10:2"),
            lambda value: config,
            profile,
            FixedLengths(20),
            ["pipeline"],
            0,
            cluster,
        )
    )
    speeds = {point.value: point.runs["pipeline"].samples_per_s for point in points}
    best, reason = recommend(points, "pipeline", "actor_gpus")
    assert best.value == max(speeds, key=speeds.__getitem__)
    assert 2 < best.value < 10, speeds
    assert reason.startswith(f"actor_gpus={best.value}: the most samples/s in pipeline mode")
    assert "the trainer waits for samples" in reason and "the actors wait" in reason, reason


def test_shipped_profiles_load_by_name_and_an_unknown_name_lists_them() -> None:
    shipped = shipped_profiles()
    assert {"h100-0.5b", "h100-7b", "h100-32b", "h200-0.5b", "h200-7b", "h200-32b"} <= set(shipped)
    for name in shipped:
        profile = resolve_profile(name)
        assert all(figure.source for figure in profile.figures.values())
        assert (profile.hardware is not None) == name.startswith(("h100", "h200")), name
    with pytest.raises(
        ProfileError, match="profile 'a100-7b': no such file, nor a shipped profile; .*h100-7b"
    ):
        resolve_profile("a100-7b")
