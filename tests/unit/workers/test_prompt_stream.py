"""The actor's prompt stream: seeded epochs, one share per actor, resumable at a position."""

from __future__ import annotations

from pipelinerl.tasks.base import Problem
from pipelinerl.workers.prompt_stream import problem_at, prompt_stream, resumed_stream


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
