"""The warm start's cache key: task options and sizes enter it; older arithmetic caches stay valid."""

from __future__ import annotations

from pipelinerl.launch.warmstart import WarmStartSettings, warm_start_dir

# The key of the default arithmetic warm start before task options and max_positions existed
# (commit d6134f3): changing it would retrain every user's cached model for nothing.
ARITHMETIC_KEY = "3d2524f6ea8ac8e1"
GYM = {"generator": "chain_sum", "params": {"min_terms": 2, "max_terms": 2}}


def test_the_default_arithmetic_key_is_unchanged():
    assert WarmStartSettings().cache_key() == ARITHMETIC_KEY


def test_task_options_and_positions_change_the_key():
    gym = WarmStartSettings(task_name="reasoning_gym", task_options=GYM)
    longer = WarmStartSettings(task_name="reasoning_gym", task_options=GYM, max_positions=512)
    other = WarmStartSettings(
        task_name="reasoning_gym", task_options={**GYM, "params": {"min_terms": 3, "max_terms": 3}}
    )
    assert len({gym.cache_key(), longer.cache_key(), other.cache_key(), ARITHMETIC_KEY}) == 4


def test_the_cache_directory_is_named_by_task_and_preset(tmp_path):
    settings = WarmStartSettings(task_name="reasoning_gym", task_options=GYM)
    assert warm_start_dir(tmp_path, settings).name.startswith("reasoning_gym-tiny-")
    assert warm_start_dir(tmp_path, WarmStartSettings()).name == f"arithmetic-tiny-{ARITHMETIC_KEY}"
