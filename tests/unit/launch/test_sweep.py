"""Sweep points: grid expansion, validation before anything runs, disjoint ports."""

from __future__ import annotations

import threading

import pytest

from pipelinerl.launch.sweep import PORT_BLOCK, PortSlots, expand_grid, point_config, sweep_points
from pipelinerl.platform.config import ConfigError, PipelineConfig, with_overrides


def test_grid_expands_to_every_combination_in_key_order():
    points = expand_grid({"rl.batch_size": [16, 32], "actor.temperature": [0.7, 1.0]})
    assert points == [
        {"rl.batch_size": 16, "actor.temperature": 0.7},
        {"rl.batch_size": 16, "actor.temperature": 1.0},
        {"rl.batch_size": 32, "actor.temperature": 0.7},
        {"rl.batch_size": 32, "actor.temperature": 1.0},
    ]
    with pytest.raises(ConfigError, match="non-empty list"):
        expand_grid({"rl.batch_size": []})
    with pytest.raises(ConfigError, match="non-empty list"):
        expand_grid({"run.mode": "pipeline"})


def test_a_bad_point_is_named_before_anything_runs():
    with pytest.raises(ConfigError, match=r"(?s)sweep point batch_size=30: .*multiple of rl.group_size"):
        sweep_points(PipelineConfig(), [{"rl.batch_size": 32}, {"rl.batch_size": 30}])
    with pytest.raises(ConfigError, match="same overrides"):
        sweep_points(PipelineConfig(), [{"rl.batch_size": 32}, {"rl.batch_size": 32}])


def test_overrides_are_validated_and_concurrent_points_get_their_own_ports():
    config = PipelineConfig()
    assert with_overrides(config, {"rl.batch_size": 16}).rl.batch_size == 16
    with pytest.raises(ConfigError, match="section.key"):
        with_overrides(config, {"batch_size": 16})
    (point,) = sweep_points(config, [{"rl.batch_size": 16}])
    assert point_config(config, point, 0).transport.base_port == config.transport.base_port
    assert point_config(config, point, 2).transport.base_port == config.transport.base_port + 2 * PORT_BLOCK


def test_points_running_at_once_never_share_a_block_of_ports():
    """Point 1 ends first while point 0 still runs: point 2 must take point 1's block, not point 0's."""
    slots = PortSlots(2)
    first, second = slots.taken(), slots.taken()
    held = [first.__enter__(), second.__enter__()]
    assert sorted(held) == [0, 1]
    second.__exit__(None, None, None)  # the point in slot held[1] ended
    with slots.taken() as third:
        assert third == held[1] != held[0]
        waiting: list[int] = []
        late = threading.Thread(target=lambda: waiting.append(slots.taken().__enter__()))
        late.start()
        late.join(timeout=0.2)
        assert late.is_alive() and not waiting, "no free block: the next point waits"
        first.__exit__(None, None, None)
        late.join(timeout=5)
        assert waiting == [held[0]]
