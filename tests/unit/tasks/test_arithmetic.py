"""The default arithmetic task: deterministic splits, a verifier that cannot be fooled by garbage."""

from __future__ import annotations

import pytest

from pipelinerl.tasks import TASK_NAMES, Problem, get_task
from pipelinerl.tasks.arithmetic import ArithmeticTask, column_steps


@pytest.fixture
def task() -> ArithmeticTask:
    return ArithmeticTask()


def test_registry_builds_the_task_and_names_valid_choices_on_error() -> None:
    assert "arithmetic" in TASK_NAMES
    assert get_task("arithmetic").name == "arithmetic"
    with pytest.raises(ValueError, match=r"'nope'.*arithmetic"):
        get_task("nope")


def test_problems_are_deterministic_in_the_seed(task: ArithmeticTask) -> None:
    assert task.problems("train", 50, seed=3) == task.problems("train", 50, seed=3)
    assert task.problems("train", 50, seed=3) != task.problems("train", 50, seed=4)
    # A longer request extends a shorter one, so callers can ask for more without reshuffling.
    assert task.problems("eval", 80, seed=3)[:40] == task.problems("eval", 40, seed=3)


def test_train_and_eval_never_share_a_problem(task: ArithmeticTask) -> None:
    train = {problem.prompt for seed in (0, 1) for problem in task.problems("train", 3000, seed)}
    evaluation = {problem.prompt for seed in (0, 1) for problem in task.problems("eval", 1000, seed)}
    assert train and evaluation
    assert not train & evaluation


def test_every_size_has_eval_problems() -> None:
    # Rejection sampling must terminate for each size, including the 100 one-digit pairs.
    for digits in range(1, 7):
        weights = tuple(1.0 if size == digits else 0.0 for size in range(1, 7))
        problems = ArithmeticTask(weights).problems("eval", 5, seed=0)
        assert all(max(len(operand) for operand in p.prompt.strip().split("+")) == digits for p in problems)


def test_problem_ids_are_unique(task: ArithmeticTask) -> None:
    problems = task.problems("train", 500, seed=0) + task.problems("eval", 500, seed=0)
    assert len({problem.problem_id for problem in problems}) == len(problems)


def test_reference_completion_is_worked_column_by_column(task: ArithmeticTask) -> None:
    problem = Problem(problem_id="p", prompt="4821+397\n", answer="5218")
    assert task.reference_completion(problem) == "1+7+0=08\n2+9+0=11\n8+3+1=12\n4+0+1=05\nA:5218"
    assert column_steps(95, 7) == ["5+7+0=12", "9+0+1=10"]


def test_verifier_accepts_every_reference_completion(task: ArithmeticTask) -> None:
    for problem in task.problems("train", 300, seed=0) + task.problems("eval", 300, seed=0):
        a, b = (int(operand) for operand in problem.prompt.strip().split("+"))
        assert problem.answer == str(a + b)
        assert task.score(problem, task.reference_completion(problem)).reward == 1.0


@pytest.mark.parametrize(
    "completion",
    [
        "",
        "A:",
        "A:5219",
        "A:52180",
        "A:5218 and more",
        "A:-5218",
        "5218",
        "\x00\x01garbage\n\n",
        "A:5218" + "9" * 10_000,
        "1+7+0=08\nA:5",
    ],
)
def test_verifier_rejects_wrong_or_garbled_answers(task: ArithmeticTask, completion: str) -> None:
    problem = Problem(problem_id="p", prompt="4821+397\n", answer="5218")
    assert task.score(problem, completion).reward == 0.0


def test_verifier_reads_the_final_answer_only(task: ArithmeticTask) -> None:
    problem = Problem(problem_id="p", prompt="4821+397\n", answer="5218")
    assert task.score(problem, "garbage steps\nA:5218").reward == 1.0
    assert task.score(problem, "A:5218\n").reward == 1.0
    assert task.score(problem, "A:5218\nA:1").reward == 0.0


def test_completion_lengths_vary_with_the_number_of_digits(task: ArithmeticTask) -> None:
    lengths = [len(task.reference_completion(p)) for p in task.problems("train", 2000, seed=0)]
    assert min(lengths) <= 15
    assert max(lengths) >= 60
    assert len(set(lengths)) >= 6


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="digit_weights"):
        ArithmeticTask(())
    with pytest.raises(ValueError, match="digit_weights"):
        ArithmeticTask((1.0, -1.0))
    with pytest.raises(ValueError, match="split"):
        ArithmeticTask().problems("test", 1, seed=0)  # type: ignore[arg-type]
