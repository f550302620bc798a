"""Configuration: every shipped file validates; bad values fail naming the field, value and rule."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
import torch

from pipelinerl.platform.config import MODES, ConfigError, PipelineConfig, flatten, load_config
from pipelinerl.platform.dtypes import policy_dtype, policy_dtype_name
from pipelinerl.workers.deepspeed_setup import deepspeed_config

CONFIGS = sorted((Path(__file__).parents[3] / "configs").glob("*.toml"))


def test_configs_are_shipped():
    assert {path.stem for path in CONFIGS} >= {"pipeline", "conventional", "async"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_every_shipped_config_validates(path):
    config = load_config(path)
    if path.stem in MODES:
        assert config.run.mode == path.stem


def test_every_field_has_a_description():
    def walk(model_type, prefix=""):
        for name, field in model_type.model_fields.items():
            assert field.description, f"{prefix}{name} has no description"
            annotation = field.annotation
            if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
                walk(annotation, f"{prefix}{name}.")

    walk(PipelineConfig)


def test_overrides_are_typed():
    config = load_config(None, ["run.mode=conventional", "rl.batch_size=64", "actor.temperature=0.7"])
    assert config.run.mode == "conventional"
    assert config.rl.batch_size == 64
    assert config.actor.temperature == 0.7


def test_bad_choice_names_field_value_and_choices():
    with pytest.raises(ConfigError) as error:
        load_config(None, ["run.mode=fast"])
    message = str(error.value)
    assert "run.mode" in message and "'fast'" in message
    assert "pipeline" in message and "conventional" in message and "async" in message


def test_bad_number_names_the_bound():
    with pytest.raises(ConfigError) as error:
        load_config(None, ["rl.group_size=1"])
    assert "rl.group_size" in str(error.value) and "greater than or equal to 2" in str(error.value)


def test_unknown_setting_is_rejected():
    with pytest.raises(ConfigError, match=r"run\.mdoe: unknown setting"):
        load_config(None, ["run.mdoe=pipeline"])


def test_batch_must_hold_whole_groups():
    with pytest.raises(ConfigError, match="multiple of rl.group_size"):
        load_config(None, ["rl.group_size=3", "rl.batch_size=32"])


@pytest.mark.parametrize("mode", ["pipeline", "async"])
def test_a_continuous_mode_needs_room_for_one_group_in_flight(mode):
    """Pipeline and async modes admit whole groups up to H: G > H would never start one (a stall)."""
    sizes = ["actor.max_in_flight=4", "rl.group_size=8", "rl.batch_size=32"]
    with pytest.raises(ConfigError, match=r"actor.max_in_flight=4 cannot hold one group of rl.group_size=8"):
        load_config(None, [f"run.mode={mode}", *sizes])
    # Conventional rounds keep max(H, G) in flight: the same sizes are a valid round.
    config = load_config(None, ["run.mode=conventional", *sizes])
    assert config.actor.max_in_flight < config.rl.group_size


def test_missing_model_directory(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(None, [f"model.path={tmp_path / 'nope'}"])


def test_model_directory_without_config(tmp_path):
    with pytest.raises(ConfigError, match="not a Hugging Face model directory"):
        load_config(None, [f"model.path={tmp_path}"])


def test_transport_host_is_an_address_and_says_whether_it_is_loopback():
    assert load_config(None, []).transport.is_loopback
    assert not load_config(None, ["transport.host=10.0.0.5"]).transport.is_loopback
    assert not load_config(None, ["transport.host=trainer-0.cluster.local"]).transport.is_loopback
    for bad in ("tcp://10.0.0.5", "*", "10.0.0.5:21100"):
        with pytest.raises(ConfigError, match="is not an address"):
            load_config(None, [f"transport.host={bad!r}"])


def test_malformed_override_and_file(tmp_path):
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["run.mode"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nmode = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_flatten_lists_every_leaf():
    flat = flatten(load_config())
    assert flat["run.mode"] == "pipeline"
    assert "trainer.zero_stage" in flat and "transport.base_port" in flat


@pytest.mark.parametrize(
    ("overrides", "size", "first_ranks"),
    [
        ([], 2, [1]),
        (["actor.num_actors=3"], 4, [1, 2, 3]),
        (["actor.engine=vllm", "actor.num_actors=2", "actor.tensor_parallel_size=4"], 9, [1, 5]),
    ],
)
def test_weight_group_ranks_count_every_engine_worker(overrides, size, first_ranks):
    """Trainer rank 0, then each actor's workers in turn (a tensor-parallel vLLM engine has several)."""
    config = load_config(None, overrides)
    assert config.weight_group_size() == size
    assert [config.actor_first_weight_rank(k) for k in range(config.actor.num_actors)] == first_ranks


def test_tensor_parallelism_needs_the_vllm_engine():
    with pytest.raises(ConfigError, match=r"actor.tensor_parallel_size=2 needs actor.engine='vllm'"):
        load_config(None, ["actor.tensor_parallel_size=2"])


def test_model_dtype_auto_is_bfloat16_on_a_gpu_and_float32_on_cpu():
    assert policy_dtype_name("auto", cuda=True) == "bfloat16"
    assert policy_dtype_name("auto", cuda=False) == "float32"
    assert policy_dtype("bfloat16", cuda=False) == torch.bfloat16  # asked for: kept, even on CPU
    assert policy_dtype("float32", cuda=True) == torch.float32
    config = load_config(None, ["model.dtype=bfloat16"])
    assert deepspeed_config(config, bf16=True)["bf16"] == {"enabled": True}
    assert "bf16" not in deepspeed_config(config)


def test_optimizer_offload_and_activation_checkpointing_reach_deepspeed_and_the_model():
    config = load_config(None, ["trainer.offload_optimizer=true", "trainer.activation_checkpointing=true"])
    zero = deepspeed_config(config)["zero_optimization"]
    assert zero == {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    assert "offload_optimizer" not in deepspeed_config(load_config(None, []))["zero_optimization"]
    with pytest.raises(ConfigError, match=r"offload_optimizer=true needs trainer.zero_stage 1, 2 or 3"):
        load_config(None, ["trainer.offload_optimizer=true", "trainer.zero_stage=0"])


def _float_fields(model_type, prefix=""):
    """Dotted paths of every float setting (``float`` or ``float | None``), sections walked."""
    for name, field in model_type.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            yield from _float_fields(annotation, f"{prefix}{name}.")
        elif annotation is float or float in typing.get_args(annotation):
            yield f"{prefix}{name}"


FLOAT_FIELDS = sorted(_float_fields(PipelineConfig))


def test_the_float_settings_are_found():
    assert {"rl.is_cap", "actor.temperature", "run.max_wall_s"} <= set(FLOAT_FIELDS)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_every_float_setting_refuses_infinity_and_nan_naming_the_field(field, value):
    # rl.is_cap=inf was accepted, written to config.json as null, and killed every stage at start.
    with pytest.raises(ConfigError, match=re.escape(f"{field}: Input should be a finite number")):
        load_config(None, [f"{field}={value}"])
