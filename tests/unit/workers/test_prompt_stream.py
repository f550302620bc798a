"""The actor's prompt stream: seeded epochs, one share per actor, resumable at a position."""

from __future__ import annotations

import itertools
from pathlib import Path

from pipelinerl.platform.checkpoint import TrainedSoFar, train_group_id, write_trained
from pipelinerl.platform.config import load_config
from pipelinerl.tasks.base import Problem
from pipelinerl.workers.prompt_stream import problem_at, prompt_stream, resumed_stream, stream_after_rebase


def test_the_prompt_stream_resumes_at_its_position() -> None:
    problems = [Problem(problem_id=str(i), prompt=f"q{i}", answer=str(i)) for i in range(7)]
    whole = prompt_stream(problems, seed=5, actor_id=1, num_actors=2)
    first = [next(whole).problem_id for _ in range(12)]
    resumed = prompt_stream(problems, seed=5, actor_id=1, num_actors=2, start=5)
    assert [next(resumed).problem_id for _ in range(7)] == first[5:12]


def test_a_resumed_stream_hands_out_the_untrained_positions_first_then_goes_on() -> None:
    problems = [Problem(problem_id=str(i), prompt=f"q{i}", answer=str(i)) for i in range(7)]
    for actor_id, num_actors in ((0, 1), (1, 2), (2, 3)):
        whole = prompt_stream(problems, seed=5, actor_id=actor_id, num_actors=num_actors)
        first = [next(whole).problem_id for _ in range(20)]  # several epochs of this actor's share
        for position in range(20):
            assert problem_at(problems, 5, actor_id, num_actors, position).problem_id == first[position]
        resumed = resumed_stream(problems, 5, actor_id, num_actors, start=9, again=[2, 6, 7])
        taken = [next(resumed) for _ in range(8)]
        order = [2, 6, 7, 9, 10, 11, 12, 13]
        assert [position for position, _ in taken] == order
        assert [problem.problem_id for _, problem in taken] == [first[p] for p in order]


def test_an_actor_outliving_a_restart_takes_up_the_checkpoints_stream_without_its_kept_groups(
    tmp_path: Path,
) -> None:
    """Trained into the checkpoint: positions 0, 1 and 3 (2 was dropped). The actor had handed out up to
    7 and kept the group of 5 in its engine: it hands out 2, then 4, 6, 7, 8... (not 5), and counts 2, 4,
    6 and 7 as handed out again."""
    trained = TrainedSoFar()
    for position in (0, 1, 3):
        trained.add(f"r{position}", train_group_id(0, position, "0123456789abcdef"))
    write_trained(tmp_path, 0, trained)
    config = load_config(None, [])
    problems = [Problem(problem_id=f"p{i}", prompt=f"q{i}", answer=str(i)) for i in range(20)]
    stream, again = stream_after_rebase(config, problems, 0, tmp_path, kept={5}, furthest=7)
    assert [position for position, _ in itertools.islice(stream, 5)] == [2, 4, 6, 7, 8]
    assert again == 4
    fresh, from_start = stream_after_rebase(config, problems, 0, None, kept=set(), furthest=3)
    assert [position for position, _ in itertools.islice(fresh, 3)] == [0, 1, 2] and from_start == 4
