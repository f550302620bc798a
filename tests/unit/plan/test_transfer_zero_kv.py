"""The costs the simulator derives from the hardware: the weight transfer from its bytes, bucket size and
link (``plan/transfer.py``), the trainer's state and step under a ZeRO stage, and the sequences an
engine's KV cache holds (``plan/cluster.py``), each on cases with a known answer."""

from __future__ import annotations

import pytest

from pipelinerl.plan.cluster import (
    GPUS,
    Cluster,
    ClusterError,
    check_fits,
    kv_cache_sequences,
    trainer_state_bytes,
    zero_step_extra_s,
)
from pipelinerl.plan.lengths import FixedLengths
from pipelinerl.plan.predict import predict
from pipelinerl.plan.profile import CostProfile, Hardware
from pipelinerl.plan.transfer import MIB, LinkCosts, MeasuredUpdate, buckets_of, fit_link
from pipelinerl.platform.config import load_config
from tests.unit.plan.test_profile import profile_data

# A 7B model on H100s whose KV cache takes 128 KiB a token.
KV_HARDWARE = Hardware(
    gpu="H100", gpus_per_engine=1, trainer_gpus=8, model_params_b=7.0, kv_bytes_per_token=131072, source="t"
)


def test_the_transfer_is_the_bytes_over_the_link_plus_a_cost_a_bucket() -> None:
    link = LinkCosts(bytes_per_s=1e9, per_bucket_s=0.01, fixed_s=0.05)
    assert buckets_of(100 * MIB, 32 * MIB) == 4
    assert link.seconds(100 * MIB, 32 * MIB) == pytest.approx(0.05 + 4 * 0.01 + 100 * MIB / 1e9)
    assert link.seconds(100 * MIB, 1) > link.seconds(100 * MIB, 256 * MIB)  # a bucket a byte: many trips
    assert link.seconds(0, 32 * MIB) == 0.05


def test_the_link_is_fitted_back_from_updates_at_several_bucket_sizes() -> None:
    truth = LinkCosts(bytes_per_s=2e9, per_bucket_s=0.004)
    model = 600 * MIB
    updates = [
        MeasuredUpdate(model, buckets_of(model, size), truth.seconds(model, size))
        for size in (1 * MIB, 4 * MIB, 32 * MIB, 256 * MIB)
    ]
    fitted = fit_link(updates)
    assert fitted.bytes_per_s == pytest.approx(2e9, rel=1e-6)
    assert fitted.per_bucket_s == pytest.approx(0.004, rel=1e-6)
    # Two model sizes tell a fixed cost from the bytes' time.
    with_fixed = LinkCosts(bytes_per_s=2e9, per_bucket_s=0.004, fixed_s=0.1)
    both = [
        MeasuredUpdate(size, buckets_of(size, bucket), with_fixed.seconds(size, bucket))
        for size in (100 * MIB, 900 * MIB)
        for bucket in (4 * MIB, 64 * MIB)
    ]
    assert fit_link(both).fixed_s == pytest.approx(0.1, rel=1e-6)
    with pytest.raises(ValueError, match="2 or more bucket sizes"):
        fit_link(updates[:1])


def test_a_profile_with_a_link_gives_the_transfer_for_the_configs_bucket_size() -> None:
    data = profile_data(transfer_s=9.0)
    data["transfer"] = {
        "link": "a test link",
        "bytes_per_s": 1e9,
        "per_bucket_s": 0.01,
        "fixed_s": 0.0,
        "update_bytes": 64 * MIB,
        "source": "a test",
    }
    profile = CostProfile.model_validate(data)
    assert profile.cost_model().transfer_s == 9.0  # no bucket size asked: the figure
    assert profile.cost_model(32 * MIB).transfer_s == pytest.approx(2 * 0.01 + 64 * MIB / 1e9)
    assert profile.cost_model(MIB).transfer_s == pytest.approx(64 * 0.01 + 64 * MIB / 1e9)


@pytest.mark.parametrize(
    ("stage", "per_gpu_bytes_per_param"),
    [(0, 16.0), (1, 4 + 12 / 8), (2, 2 + 14 / 8), (3, 16 / 8)],
)
def test_each_zero_stage_shards_its_share_of_the_state(stage: int, per_gpu_bytes_per_param: float) -> None:
    assert trainer_state_bytes(1e9, 8, stage) == pytest.approx(per_gpu_bytes_per_param * 1e9)


def test_a_stage_that_does_not_fit_names_the_gpus_and_the_stage_that_would() -> None:
    hardware = Hardware(gpu="H100", gpus_per_engine=1, trainer_gpus=8, model_params_b=7.0, source="t")
    check_fits(hardware, Cluster(8, 4, "H100"), zero_stage=3)  # 28 GB a GPU
    with pytest.raises(
        ClusterError, match=r"ZeRO-2.*at least 3 trainer GPUs, or a higher trainer.zero_stage"
    ):
        check_fits(hardware, Cluster(8, 2, "H100"), zero_stage=2)
    with pytest.raises(ClusterError, match="ZeRO-0.*no number of trainer GPUs holds it"):
        check_fits(hardware, Cluster(8, 8, "H100"), zero_stage=0)  # 112 GB on every GPU


def test_zero3_gathers_the_weights_once_more_a_step() -> None:
    hardware = Hardware(gpu="H100", gpus_per_engine=1, trainer_gpus=8, model_params_b=8.0, source="t")
    cluster = Cluster(8, 8, "H100")
    gathered = 2 * 8e9 * 7 / 8
    assert zero_step_extra_s(hardware, cluster, 3, 50e9) == 0.0  # the profile's own stage
    assert zero_step_extra_s(hardware, cluster, 2, 50e9) == pytest.approx(-gathered / 50e9)
    assert zero_step_extra_s(hardware, Cluster(8, 1, "H100"), 2, 50e9) == 0.0  # one GPU gathers nothing


def test_the_kv_cache_caps_the_sequences_an_engine_holds() -> None:
    hardware = KV_HARDWARE
    room = 0.9 * GPUS["H100"] - 14e9
    assert kv_cache_sequences(hardware, "H100", 0.9, 4096) == int(room // (131072 * 4096))
    no_kv = hardware.model_copy(update={"kv_bytes_per_token": None})
    assert kv_cache_sequences(no_kv, "H100", 0.9, 4096) is None
    with pytest.raises(ClusterError, match="less than one sequence of 100000 tokens"):
        kv_cache_sequences(hardware, "H100", 0.3, 100_000)


def test_predict_runs_the_engines_at_what_their_kv_cache_holds() -> None:
    hardware = KV_HARDWARE
    profile = CostProfile.model_validate(
        {**profile_data(decode_base_s=0.01, train_base_s=0.1), "hardware": hardware.model_dump()}
    )
    config = load_config(None, ["actor.max_in_flight=512", "rl.batch_size=64", "run.max_steps=4"])
    lengths = FixedLengths(2000)
    held = kv_cache_sequences(hardware, "H100", config.actor.gpu_memory_utilization, 100 + 2000)
    assert held is not None and held < 512
    runs = predict(config, profile, lengths, ["pipeline"], 100, Cluster(8, 8, "H100"))
    assert runs["pipeline"].in_flight == held
