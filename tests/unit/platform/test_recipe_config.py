"""The training recipes' settings (``rl.loss``, its clip bounds, ``rl.loss_normalisation``, ``rl.kl``,
``rl.entropy_coef``, ``rl.overlong``): typed, reachable by ``--set`` and ``flatten``, and a nonsense
combination refused naming the fields, in the config and in Prefect's run form."""

from __future__ import annotations

from typing import Any

import pytest
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools.validation import validate

from pipelinerl.flows.rl_run import rl_run
from pipelinerl.platform.config import ConfigError, PipelineConfig, flatten, load_config, with_overrides


def test_the_defaults_are_todays_recipe() -> None:
    rl = load_config().rl
    assert rl.loss == "truncated_is" and rl.loss_normalisation == "sequence"
    assert (rl.clip_low, rl.clip_high) == (None, None)
    assert (rl.kl.coef, rl.kl.estimator, rl.entropy_coef) == (0.0, "k3", 0.0)
    assert rl.overlong.enabled is False


def test_nested_settings_are_set_flattened_and_overridden() -> None:
    config = load_config(
        None,
        [
            "rl.loss=cispo",
            "rl.clip_high=0.3",
            "rl.loss_normalisation=token",
            "rl.kl.coef=0.05",
            "rl.kl.estimator=k2",
            "rl.entropy_coef=0.001",
            "rl.overlong.enabled=true",
            "rl.overlong.buffer=16",
        ],
    )
    flat = flatten(config)
    assert flat["rl.kl.coef"] == 0.05 and flat["rl.kl.estimator"] == "k2"
    assert flat["rl.overlong.enabled"] is True and flat["rl.overlong.buffer"] == 16
    assert flat["rl.clip_high"] == 0.3 and flat["rl.clip_low"] is None
    assert config.value_at("rl.kl.estimator") == "k2"
    changed = with_overrides(config, {"rl.kl.coef": 0.2, "rl.overlong.buffer": 8})
    assert changed.rl.kl.coef == 0.2 and changed.rl.overlong.buffer == 8 and changed.rl.kl.estimator == "k2"


@pytest.mark.parametrize(
    ("override", "valid"),
    [
        ("rl.loss=grpo", ("truncated_is", "ppo_clip", "gspo", "cispo")),
        ("rl.loss_normalisation=mean", ("sequence", "token", "constant")),
        ("rl.kl.estimator=k4", ("k1", "k2", "k3")),
    ],
)
def test_an_unknown_choice_names_the_field_and_the_valid_values(
    override: str, valid: tuple[str, ...]
) -> None:
    field = override.partition("=")[0]
    with pytest.raises(ConfigError) as error:
        load_config(None, [override])
    message = str(error.value)
    assert field in message
    assert all(f"'{value}'" in message for value in valid), message


@pytest.mark.parametrize(
    ("override", "bound"),
    [
        ("rl.kl.coef=-0.1", "greater than or equal to 0"),
        ("rl.entropy_coef=-1", "greater than or equal to 0"),
        ("rl.clip_low=1.0", "less than 1"),
        ("rl.clip_high=0", "greater than 0"),
        ("rl.overlong.buffer=0", "greater than or equal to 1"),
    ],
)
def test_a_bad_number_names_the_field_and_the_bound(override: str, bound: str) -> None:
    field = override.partition("=")[0]
    with pytest.raises(ConfigError) as error:
        load_config(None, ["rl.loss=ppo_clip", override])
    assert field in str(error.value) and bound in str(error.value)


@pytest.mark.parametrize("bound", ["clip_low", "clip_high"])
def test_clip_bounds_are_refused_with_truncated_is_naming_the_fields(bound: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(None, [f"rl.{bound}=0.2"])
    message = str(error.value)
    assert f"rl.{bound}=0.2" in message and "rl.loss='truncated_is'" in message and "rl.is_cap" in message
    assert "'ppo_clip', 'gspo' or 'cispo'" in message


@pytest.mark.parametrize("loss", ["ppo_clip", "gspo", "cispo"])
def test_clip_bounds_are_taken_by_the_clipping_losses(loss: str) -> None:
    rl = load_config(None, [f"rl.loss={loss}", "rl.clip_low=0.2", "rl.clip_high=0.28"]).rl
    assert (rl.clip_low, rl.clip_high) == (0.2, 0.28)


@pytest.mark.parametrize("normalisation", ["token", "constant"])
def test_gspo_takes_only_sequence_normalisation_naming_both_fields(normalisation: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(None, ["rl.loss=gspo", f"rl.loss_normalisation={normalisation}"])
    message = str(error.value)
    assert f"rl.loss_normalisation='{normalisation}'" in message and "rl.loss='gspo'" in message
    assert "'sequence'" in message


def test_an_overlong_buffer_must_fit_below_max_new_tokens_naming_both() -> None:
    with pytest.raises(ConfigError) as error:
        load_config(None, ["rl.overlong.enabled=true", "rl.overlong.buffer=16", "actor.max_new_tokens=16"])
    message = str(error.value)
    assert "rl.overlong.buffer=16" in message and "actor.max_new_tokens=16" in message
    # off, the buffer is not looked at; below the limit it is accepted
    load_config(None, ["rl.overlong.buffer=16", "actor.max_new_tokens=16"])
    load_config(None, ["rl.overlong.enabled=true", "rl.overlong.buffer=15", "actor.max_new_tokens=16"])


def test_overlong_penalty_with_the_truncation_penalty_is_refused_naming_both() -> None:
    with pytest.raises(ConfigError) as error:
        load_config(None, ["rl.overlong.enabled=true", "rl.truncated=penalise"])
    message = str(error.value)
    assert "rl.overlong.enabled=true" in message and "rl.truncated='penalise'" in message
    for truncated in ("train", "mask"):
        load_config(None, ["rl.overlong.enabled=true", f"rl.truncated={truncated}"])


# ----- Prefect's run form: the same rules in the parameter schema -----


def _form_errors(rl: dict[str, Any]) -> list[str]:
    data = PipelineConfig().model_dump(mode="json")
    for key, value in rl.items():
        if isinstance(value, dict):
            data["rl"][key].update(value)
        else:
            data["rl"][key] = value
    return [error.json_path for error in validate({"config": data}, parameter_schema(rl_run).model_dump())]


@pytest.mark.parametrize(
    ("rl", "paths"),
    [
        ({"clip_high": 0.28}, ["$.config.rl.clip_high"]),
        ({"clip_low": 0.1, "clip_high": 0.28}, ["$.config.rl.clip_low", "$.config.rl.clip_high"]),
        ({"overlong": {"enabled": True}, "truncated": "penalise"}, ["$.config.rl.truncated"]),
        ({"kl": {"estimator": "k4"}}, ["$.config.rl.kl.estimator"]),
        ({"kl": {"coef": -1.0}}, ["$.config.rl.kl.coef"]),
        ({"loss": "grpo"}, ["$.config.rl.loss"]),
        ({"loss": "gspo", "loss_normalisation": "token"}, ["$.config.rl.loss_normalisation"]),
        ({"loss_normalisation": "mean"}, ["$.config.rl.loss_normalisation"]),
    ],
)
def test_the_form_refuses_a_nonsense_recipe_naming_the_fields(rl: dict[str, Any], paths: list[str]) -> None:
    assert sorted(_form_errors(rl)) == sorted(paths)


@pytest.mark.parametrize(
    "rl",
    [
        {"loss": "ppo_clip", "clip_low": 0.2, "clip_high": 0.28, "loss_normalisation": "token"},
        {"loss": "gspo"},
        {"loss": "cispo", "clip_high": 5.0, "loss_normalisation": "constant"},
        {"kl": {"coef": 0.1, "estimator": "k1"}, "entropy_coef": 0.01},
        {"overlong": {"enabled": True, "buffer": 16}, "truncated": "mask"},
    ],
)
def test_the_form_and_the_config_accept_a_consistent_recipe(rl: dict[str, Any]) -> None:
    assert _form_errors(rl) == []
    data = PipelineConfig().model_dump(mode="json")
    for key, value in rl.items():
        data["rl"][key] = {**data["rl"][key], **value} if isinstance(value, dict) else value
    PipelineConfig.model_validate(data)


def test_the_form_describes_every_recipe_setting() -> None:
    definitions = parameter_schema(rl_run).model_dump()["definitions"]
    rl = definitions["RLConfig"]["properties"]
    assert rl["loss"]["enum"] == ["truncated_is", "ppo_clip", "gspo", "cispo"]
    assert rl["loss_normalisation"]["enum"] == ["sequence", "token", "constant"]
    for section in ("KLConfig", "OverlongConfig"):
        for name, field in definitions[section]["properties"].items():
            assert field.get("description"), f"{section}.{name} has no description"
    assert definitions["KLConfig"]["properties"]["estimator"]["enum"] == ["k1", "k2", "k3"]
