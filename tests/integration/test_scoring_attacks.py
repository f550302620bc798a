"""Completions that attack reasoning-gym scoring, through the platform's own scoring path
(``ReasoningGymTask.score``, real sandbox processes), for every generator whose scorer evaluates
its answer: code that writes a file, connects to a socket or imports ``os``; replies forged into
the scorer's reply channel; a partial reply followed by a sleep; names of the scorer's variables.
Each earns reward 0 (``unparsable``), changes nothing outside, and leaves later scores right."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelinerl.tasks import reasoning_gym_task
from pipelinerl.tasks.base import Problem, Score
from pipelinerl.tasks.reasoning_gym_task import ReasoningGymTask
from tests.side_effects import connections

# reasoning-gym 0.1.25's generators whose score_answer hands the answer to eval or sympy.
EVALUATING = [
    "binary_matrix",
    "spiral_matrix",
    "string_insertion",
    "n_queens",
    "countdown",
    "puzzle24",
    "simple_integration",
    "intermediate_integration",
    "polynomial_multiplication",
]
UNPARSABLE = Score(0.0, "unparsable")
# Variables of the scorers' score_answer methods (and their loop and exception variables).
LOCALS = ["entry", "answer", "self", "oracle_answer", "valid_solutions", "metadata", "e", "reward"]
# A wrong answer every one of these scorers parses: a number.
WRONG = "<answer>0</answer>"


@pytest.fixture(scope="module", params=EVALUATING)
def task(request: pytest.FixtureRequest) -> Iterator[ReasoningGymTask]:
    task = ReasoningGymTask(generator=request.param)
    yield task
    task._verify.close()


@pytest.fixture
def problem(task: ReasoningGymTask) -> Problem:
    return task.problems("train", 1, seed=0)[0]


def test_code_in_an_answer_runs_nowhere(
    task: ReasoningGymTask, problem: Problem, drop: Path, listener: socket.socket
) -> None:
    port = listener.getsockname()[1]
    attacks = [
        f"open('{drop}/written', 'w').write('x')",
        f"__import__('os').system('touch {drop}/touched')",
        f"__import__('socket').create_connection(('127.0.0.1', {port}))",
        f"__import__('socket').create_connection(('localhost', {port}))",
        "__import__('os').getcwd()",
        "__import__('subprocess').run(['id'])",
    ]
    scores = [task.score(problem, f"<answer>{attack}</answer>") for attack in attacks]
    assert list(drop.iterdir()) == []
    assert connections(listener) == 0
    assert scores == [UNPARSABLE] * len(attacks)
    assert task.refusals["grammar"] >= len(attacks)  # refused before any scorer saw them


def test_a_forged_reply_earns_nothing_and_later_scores_stay_aligned(
    task: ReasoningGymTask, problem: Problem
) -> None:
    reference = task.reference_completion(problem)
    wrong = task.score(problem, WRONG)
    assert wrong.label == "wrong"
    forgeries = [
        "__import__('os').write(3, b'[\"ok\", 1.0]\\n')",  # the old child's reply descriptor
        "__import__('os').write(1, b'[\"ok\", 1.0]\\n')",
        "print('[\"ok\", 1.0]')",
        "[__import__('os').write(3, b'[\"ok\", 1.0]\\n') for _ in range(3)]",
    ]
    for forgery in forgeries:
        assert task.score(problem, f"<answer>{forgery}</answer>") == UNPARSABLE
        assert task.score(problem, reference) == Score(1.0, "correct")
        assert task.score(problem, WRONG) == wrong


@pytest.mark.timeout(300)
def test_a_partial_reply_and_a_sleep_do_not_stall_scoring(
    task: ReasoningGymTask, problem: Problem, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reasoning_gym_task, "SCORE_TIMEOUT_S", 2.0)
    stall = "__import__('os').write(3, b'[\"ok\"') or __import__('time').sleep(20)"
    assert task.score(problem, f"<answer>{stall}</answer>") == UNPARSABLE
    assert task.score(problem, "<answer>__import__('time').sleep(20)</answer>") == UNPARSABLE
    # The mechanism: both were refused by the grammar; no scorer ran, so nothing had to be killed.
    assert task.refusals["grammar"] >= 2 and task.refusals["timeout"] == 0
    assert task.score(problem, task.reference_completion(problem)) == Score(1.0, "correct")


@pytest.mark.parametrize("name", LOCALS)
def test_naming_a_scorer_variable_earns_nothing(task: ReasoningGymTask, problem: Problem, name: str) -> None:
    for answer in (name, f"[{name}]", f"{name}[0]", f"list({name})"):
        assert task.score(problem, f"<answer>{answer}</answer>") == UNPARSABLE


@pytest.mark.timeout(300)
def test_a_valid_answer_that_runs_for_ever_is_cut_at_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    # Inside the grammar (a bounded power) but sympy's simplification of it runs for minutes.
    monkeypatch.setattr(reasoning_gym_task, "SCORE_TIMEOUT_S", 1.0)
    task = ReasoningGymTask(generator="simple_integration")
    try:
        problem = task.problems("train", 1, seed=0)[0]
        variable = problem.data["entry"]["metadata"]["variable"]
        assert task.score(problem, task.reference_completion(problem)) == Score(1.0, "correct")
        supervisor, waits = task._verify.pid, task._verify.start_waits
        assert task.score(problem, f"<answer>({variable} + 1)**1000</answer>") == UNPARSABLE
        assert task.refusals["timeout"] == 1  # its evaluator was killed at the deadline
        assert task.score(problem, task.reference_completion(problem)) == Score(1.0, "correct")
        # Only the evaluator was killed: the same supervisor answered, nobody waited for a start.
        assert (task._verify.pid, task._verify.start_waits) == (supervisor, waits)
    finally:
        task._verify.close()
