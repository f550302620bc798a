"""What `pipelinerl plan` takes when given no --profile or --lengths (plan/defaults.py)."""

from __future__ import annotations

import pytest

from pipelinerl.plan.defaults import MACHINE_PROFILE, choose_profile, params_b_of, profile_lengths
from pipelinerl.plan.profile import CostProfile, ProfileError, load_profile, shipped_profiles
from tests.unit.plan.test_profile import profile_data


@pytest.mark.parametrize(
    ("model", "params"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", 7.0),
        ("Qwen/Qwen3-0.6B", 0.6),
        ("meta-llama/Llama-3.1-8B", 8.0),
        ("/models/qwen2.5-32b", 32.0),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 1.5),
        ("Qwen/Qwen2.5-7B-Instruct-bnb-8bit", 7.0),  # "8bit" is no size
        ("nvidia/B200-tuned", None),  # a GPU's name is no size
        ("/runs/abc/final", None),
        (None, None),
    ],
)
def test_a_models_size_is_read_off_its_name(model, params) -> None:
    assert params_b_of(model) == params


def test_without_a_cluster_the_machine_profile_is_taken() -> None:
    name, why = choose_profile(None, "Qwen/Qwen2.5-7B")
    assert name == MACHINE_PROFILE and "no --cluster" in why


@pytest.mark.parametrize(
    ("gpu", "model", "expected"),
    [
        ("H100", "Qwen/Qwen2.5-7B-Instruct", "h100-7b"),
        ("H100", "meta-llama/Llama-3.1-8B", "h100-7b"),
        ("H200", "Qwen/Qwen3-0.6B", "h200-0.5b"),
        ("H200", "Qwen/Qwen2.5-72B", "h200-32b"),
        ("H100", "Qwen/Qwen2.5-3B", "h100-7b"),  # log scale: 3 is nearer 7 than 0.5
        ("H100", "Qwen/Qwen2.5-1.5B", "h100-0.5b"),
        ("H100", None, "h100-0.5b"),  # no size given: the smallest
    ],
)
def test_a_cluster_takes_its_gpus_profile_nearest_the_models_size(gpu, model, expected) -> None:
    name, why = choose_profile(gpu, model)
    assert name == expected
    assert gpu in why and name in why


def test_a_gpu_no_profile_describes_is_named_with_those_that_are() -> None:
    with pytest.raises(ProfileError, match="no shipped profile describes A100; they describe H100, H200"):
        choose_profile("A100", "Qwen/Qwen2.5-7B")


def test_every_shipped_profile_carries_lengths_it_can_draw() -> None:
    for name, path in shipped_profiles().items():
        lengths, why = profile_lengths(load_profile(path))
        assert name in why and lengths in why


def test_a_profile_without_lengths_asks_for_them_and_bad_lengths_are_refused() -> None:
    profile = CostProfile.model_validate(profile_data())
    with pytest.raises(ProfileError, match="carries no lengths: give --lengths"):
        profile_lengths(profile)
    for bad in ("uniform:3", "run:/somewhere"):
        with pytest.raises(ValueError, match="lengths"):
            CostProfile.model_validate(profile_data() | {"lengths": bad})
