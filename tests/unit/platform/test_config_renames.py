"""Renamed settings: a config that still uses the old name fails, naming the new one."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pipelinerl.platform.config import ConfigError, PipelineConfig, load_config, with_overrides


def test_run_async_drain_lag_sets_when_the_async_actor_drains_and_names_the_mode():
    config = load_config(None, ["run.mode=async", "run.async_drain_lag=3"])
    assert config.run.async_drain_lag == 3
    assert config.mode_label() == "async-lag3"
    assert config.rl.max_lag is None, "the preprocessor's staleness drop is another setting"


def test_run_max_lag_in_an_override_names_its_new_name():
    with pytest.raises(ConfigError) as error:
        load_config(None, ["run.mode=async", "run.max_lag=2"])
    message = str(error.value)
    assert "run.max_lag=2 was renamed run.async_drain_lag" in message
    assert "rl.max_lag" in message


def test_run_max_lag_in_a_toml_file_names_its_new_name(tmp_path):
    path = tmp_path / "old.toml"
    path.write_text('[run]\nmode = "async"\nmax_lag = 4\n')
    with pytest.raises(ConfigError, match=r"run: run\.max_lag=4 was renamed run\.async_drain_lag"):
        load_config(path)


def test_run_max_lag_in_json_or_a_form_names_its_new_name():
    """A run directory's config.json, and the parameters of Prefect's form, validate the same way."""
    with pytest.raises(ValidationError, match=r"run\.max_lag=1 was renamed run\.async_drain_lag"):
        PipelineConfig.model_validate_json('{"run": {"mode": "async", "max_lag": 1}}')
    with pytest.raises(ValidationError, match=r"renamed run\.async_drain_lag"):
        PipelineConfig.model_validate({"run": {"max_lag": 1}})


def test_run_max_lag_in_a_sweep_override_names_its_new_name():
    with pytest.raises(ConfigError, match=r"run\.max_lag=2 was renamed run\.async_drain_lag"):
        with_overrides(load_config(None, []), {"run.max_lag": 2})
