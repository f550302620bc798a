"""Which rank a trainer process is: ``--rank``, else ``RANK`` from the launcher or torchrun."""

from __future__ import annotations

import pytest

from pipelinerl.workers.trainer import placed_rank


def test_the_rank_comes_from_the_flag_else_from_the_launcher_s_environment():
    assert placed_rank(None, {"RANK": "1", "WORLD_SIZE": "2"}, 2) == 1
    assert placed_rank(1, {"RANK": "1", "WORLD_SIZE": "2"}, 2) == 1
    assert placed_rank(1, {}, 2) == 1
    assert placed_rank(None, {}, 1) == 0  # alone


@pytest.mark.parametrize(
    ("flag", "environ", "processes", "problem"),
    [
        (None, {"RANK": "0", "WORLD_SIZE": "4"}, 2, "WORLD_SIZE=4 but trainer.num_processes=2"),
        (0, {"RANK": "1", "WORLD_SIZE": "2"}, 2, "--rank 0 disagrees with RANK=1"),
        (None, {"RANK": "2"}, 2, r"rank 2 is outside 0..1 \(trainer.num_processes=2\)"),
    ],
)
def test_a_placement_that_is_not_the_config_s_job_is_refused(flag, environ, processes, problem):
    with pytest.raises(SystemExit, match=problem):
        placed_rank(flag, environ, processes)
