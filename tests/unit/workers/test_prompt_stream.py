"""The actor's prompt stream: seeded epochs, one share per actor, resumable at a position."""

from __future__ import annotations

from pipelinerl.tasks.base import Problem
from pipelinerl.workers.prompt_stream import prompt_stream


def test_the_prompt_stream_resumes_at_its_position() -> None:
    problems = [Problem(problem_id=str(i), prompt=f"q{i}", answer=str(i)) for i in range(7)]
    whole = prompt_stream(problems, seed=5, actor_id=1, num_actors=2)
    first = [next(whole).problem_id for _ in range(12)]
    resumed = prompt_stream(problems, seed=5, actor_id=1, num_actors=2, start=5)
    assert [next(resumed).problem_id for _ in range(7)] == first[5:12]
