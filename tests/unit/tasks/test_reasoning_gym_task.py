"""The reasoning-gym task on the real library: deterministic disjoint splits, tag scoring, helpful errors."""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import reasoning_gym
from reasoning_gym.algorithmic.spell_backward import SpellBackwardConfig, SpellBackwardDataset
from reasoning_gym.factory import DATASETS, register_dataset

from pipelinerl.tasks import Message, Problem, Score, Task, TaskError, get_task, reasoning_gym_task
from pipelinerl.tasks.reasoning_gym_task import (
    DEFAULT_INSTRUCTION,
    ReasoningGymTask,
    extract_answer,
    generator_names,
)

GENERATORS = ("basic_arithmetic", "chain_sum", "gsm_symbolic")
CONFIGS = Path(__file__).resolve().parents[3] / "configs"
# chain_sum with two one-digit terms: about 200 distinct questions, 26 of them in eval.
TINY_CHAIN_SUM = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def _signature(problems: list[Problem]) -> list[tuple[object, ...]]:
    # Problem equality leaves out data, so the generator entry is compared here.
    return [(p.problem_id, p.prompt, p.answer, p.messages, p.data["entry"]) for p in problems]


SharedTask = Callable[..., ReasoningGymTask]


@pytest.fixture(scope="module")
def shared_task() -> Iterator[SharedTask]:
    """The task of a generator and params, built once for this module's tests: the first score
    starts its sandbox, whose supervisor imports reasoning-gym (about 2 s)."""
    built: dict[str, ReasoningGymTask] = {}

    def get(generator: str, params: dict[str, object] | None = None) -> ReasoningGymTask:
        key = json.dumps([generator, params or {}], sort_keys=True)
        if key not in built:
            built[key] = ReasoningGymTask(generator=generator, params=params)
        return built[key]

    yield get
    for task in built.values():
        task._verify.close()


@pytest.fixture(scope="module", params=GENERATORS)
def task(request: pytest.FixtureRequest, shared_task: SharedTask) -> ReasoningGymTask:
    return shared_task(request.param)


def test_generator_names_are_sorted_and_include_the_usual_ones() -> None:
    names = generator_names()
    assert names == sorted(names)
    assert {*GENERATORS, "countdown"} <= set(names)


def test_registry_builds_the_task_with_options() -> None:
    task = get_task("reasoning_gym", generator="chain_sum", params={"max_terms": 3})
    assert isinstance(task, ReasoningGymTask) and isinstance(task, Task)
    assert task.name == "reasoning_gym" and task.params == {"max_terms": 3}
    with pytest.raises(TaskError, match="chain_sum"):
        get_task("reasoning_gym", generator="chain_sums")


def test_problems_are_deterministic_in_the_seed(task: ReasoningGymTask) -> None:
    first = task.problems("train", 60, seed=3)
    assert _signature(first) == _signature(task.problems("train", 60, seed=3))
    assert _signature(first) != _signature(task.problems("train", 60, seed=4))
    # A longer request extends a shorter one, so callers can ask for more without reshuffling.
    assert _signature(task.problems("eval", 30, seed=3)[:10]) == _signature(task.problems("eval", 10, seed=3))


def test_counts_are_honoured(task: ReasoningGymTask) -> None:
    for split in ("train", "eval"):
        for count in (0, 1, 37):
            assert len(task.problems(split, count, seed=0)) == count


def test_train_and_eval_never_share_a_question(task: ReasoningGymTask) -> None:
    # Any seeds would do: these spare basic_arithmetic's divisor search, which takes seconds on the
    # rare item with a large common divisor (seeds 1, 5, 7 and 11 each draw one).
    seeds = (0, 9, 10)
    train = {p.prompt for seed in seeds for n in (5, 400) for p in task.problems("train", n, seed)}
    evaluation = {p.prompt for seed in seeds for n in (5, 200) for p in task.problems("eval", n, seed)}
    assert len(train) > 400 and len(evaluation) > 200
    assert not train & evaluation


def test_problem_ids_are_unique_and_follow_the_question(task: ReasoningGymTask) -> None:
    problems = task.problems("train", 300, seed=0) + task.problems("eval", 100, seed=0)
    assert len({p.problem_id for p in problems}) == len({p.prompt for p in problems}) == len(problems)
    assert all(p.problem_id.startswith(f"{task.generator}-") for p in problems)
    # The same question drawn under another seed keeps its id.
    by_prompt = {p.prompt: p.problem_id for p in problems}
    again = task.problems("train", 3000, seed=1)
    shared = [p for p in again if p.prompt in by_prompt]
    assert all(by_prompt[p.prompt] == p.problem_id for p in shared)


def test_problem_ids_do_not_depend_on_the_process() -> None:
    # The actor and the preprocessor build the lists in different processes (other string hash seeds).
    program = (
        "import json\n"
        "from pipelinerl.tasks.reasoning_gym_task import ReasoningGymTask\n"
        "ids = lambda g: [p.problem_id for p in ReasoningGymTask(generator=g).problems('train', 50, 5)]\n"
        f"print(json.dumps({{g: ids(g) for g in {GENERATORS!r}}}))\n"
    )
    environment = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=environment, check=True
    )
    other_process = json.loads(result.stdout.strip().splitlines()[-1])
    for generator in GENERATORS:
        here = [p.problem_id for p in ReasoningGymTask(generator=generator).problems("train", 50, 5)]
        assert other_process[generator] == here


def test_prompt_and_messages_carry_the_question_and_the_instruction(task: ReasoningGymTask) -> None:
    for problem in task.problems("train", 20, seed=0):
        question = problem.data["entry"]["question"]
        assert problem.prompt.startswith(question.rstrip()) and problem.prompt.endswith(DEFAULT_INSTRUCTION)
        assert problem.messages == (Message("user", problem.prompt),)
        assert problem.answer == str(problem.data["entry"]["answer"])
        assert problem.data["generator"] == task.generator


def test_system_prompt_and_instruction_options() -> None:
    task = ReasoningGymTask(
        generator="chain_sum", instruction="Answer in <answer> tags.", system_prompt="Be brief."
    )
    problem = task.problems("eval", 1, seed=0)[0]
    assert problem.prompt.endswith("\n\nAnswer in <answer> tags.")
    assert problem.messages == (Message("system", "Be brief."), Message("user", problem.prompt))


def test_scoring_of_reference_wrong_missing_and_open_answers(task: ReasoningGymTask) -> None:
    assert task.stop_strings == ("</answer>",)
    for problem in task.problems("train", 10, seed=0) + task.problems("eval", 5, seed=0):
        reference = task.reference_completion(problem)
        assert reference == f"<answer>{problem.answer}</answer>"
        assert task.score(problem, reference).label == "correct"
        assert task.score(problem, reference).reward == 1.0
        # Cut at the stop string: the closing tag is missing and the answer still counts.
        assert task.score(problem, f"Some steps. <answer>{problem.answer}").label == "correct"
        # The last tag wins.
        last = f"<answer>0.123</answer> no, <answer> {problem.answer} </answer>"
        assert task.score(problem, last).reward == 1.0
        wrong = task.score(problem, f"<answer>{float(problem.answer) + 1000.5}</answer>")
        assert wrong.label == "wrong" and 0.0 <= wrong.reward < 1.0
        assert task.score(problem, f"The answer is {problem.answer}.").label == "no_answer"
        assert task.score(problem, "<answer></answer>").label == "no_answer"
        assert task.score(problem, "").label == "no_answer"


def test_partial_credit_is_the_generators(shared_task: SharedTask) -> None:
    task = shared_task("gsm_symbolic")
    problem = task.problems("train", 1, seed=0)[0]
    assert task.score(problem, f"<answer>{float(problem.answer) + 1}</answer>").reward == pytest.approx(0.01)


def test_extract_answer() -> None:
    assert extract_answer("x <answer> 42 </answer> y") == "42"
    assert extract_answer("<answer>1</answer><answer>2</answer>") == "2"
    assert extract_answer("<answer>1</answer> then <answer>2") == "2"
    assert extract_answer("<answer>\n") is None
    assert extract_answer("42") is None


def test_a_verifier_that_raises_scores_unparsable() -> None:
    task = ReasoningGymTask(generator="prime_factorization")
    problem = task.problems("train", 1, seed=0)[0]
    assert task.score(problem, task.reference_completion(problem)).label == "correct"
    assert task.score(problem, "<answer>x</answer>").label == "unparsable"
    task._verify.close()


@pytest.mark.timeout(120)
def test_an_answer_outside_the_grammar_never_reaches_the_scorer() -> None:
    # countdown evaluates the answer with sympy, which never finishes 9**9**9**9: its grammar has no
    # power, so the scorer never sees it (a valid answer that runs for ever is cut at the timeout:
    # tests/integration/test_scoring_attacks.py).
    task = ReasoningGymTask(generator="countdown")
    problem = task.problems("train", 1, seed=0)[0]
    assert task.score(problem, "<answer>9**9**9**9</answer>") == Score(0.0, "unparsable")
    assert task.refusals == {"grammar": 1}
    assert task.score(problem, task.reference_completion(problem)).label == "correct"
    # A copy (another process's task) starts its own sandbox.
    copy = pickle.loads(pickle.dumps(task))
    assert copy.score(problem, task.reference_completion(problem)).label == "correct"
    assert copy._verify.pid not in (None, task._verify.pid)
    task._verify.close()
    copy._verify.close()


@pytest.fixture
def unaudited_generator() -> Iterator[str]:
    """A generator the audit does not know: one the user registered (here spell_backward's classes)."""
    register_dataset("my_spelling", SpellBackwardDataset, SpellBackwardConfig)
    yield "my_spelling"
    del DATASETS["my_spelling"]


def test_an_unaudited_generator_is_refused_unless_its_risk_is_accepted(unaudited_generator: str) -> None:
    with pytest.raises(
        ValueError,
        match=r"'my_spelling'.*nobody audited.*evaluate answer text as code.*"
        r"allow_unsafe_scorer = true",
    ):
        ReasoningGymTask(generator=unaudited_generator)
    with pytest.raises(TaskError, match="allow_unsafe_scorer"):
        get_task("reasoning_gym", generator=unaudited_generator)
    with pytest.raises(ValueError, match="allow_unsafe_scorer must be true or false, got 'yes'"):
        ReasoningGymTask(generator="chain_sum", allow_unsafe_scorer="yes")  # type: ignore[arg-type]
    task = ReasoningGymTask(generator=unaudited_generator, allow_unsafe_scorer=True)
    assert task.allow_unsafe_scorer and task.problems("train", 1, seed=0)


def _shipped_generators() -> list[tuple[str, dict[str, object]]]:
    found = []
    for path in sorted(CONFIGS.glob("*.toml")):
        task = tomllib.loads(path.read_text()).get("task", {})
        if task.get("name") == "reasoning_gym":
            options = task.get("options", {})
            found.append((options["generator"], dict(options.get("params", {}))))
    return found


@pytest.mark.parametrize(("generator", "params"), [*_shipped_generators(), ("chain_sum", {})])
def test_the_shipped_configs_generators_score_as_their_library_does(
    generator: str, params: dict[str, object], shared_task: SharedTask
) -> None:
    # Safe scorers get the raw answer: the sandboxed score equals the library's own, partial credit too.
    task = shared_task(generator, params)
    dataset = reasoning_gym.create_dataset(generator, seed=0, size=1, **params)
    for problem in task.problems("train", 5, seed=0):
        entry = problem.data["entry"]
        for answer in (problem.answer, problem.answer[:-1] or "x", problem.answer[::-1], "0"):
            expected = float(dataset.score_answer(answer, entry))
            score = task.score(problem, f"<answer>{answer}</answer>")
            assert score.reward == (1.0 if expected >= 1.0 else max(expected, 0.0)), (answer, score)


def test_a_generator_without_reference_answers_cannot_warm_start() -> None:
    task = ReasoningGymTask(generator="graph_color")
    problem = task.problems("train", 1, seed=0)[0]
    assert problem.answer == ""
    with pytest.raises(ValueError, match=r"'graph_color'.*model\.path"):
        task.reference_completion(problem)


def test_a_small_question_space_runs_dry_without_looping(caplog: pytest.LogCaptureFixture) -> None:
    task = ReasoningGymTask(generator="chain_sum", params=TINY_CHAIN_SUM)
    with caplog.at_level(logging.WARNING, logger=reasoning_gym_task.__name__):
        train = task.problems("train", 1000, seed=0)
        evaluation = task.problems("eval", 1000, seed=0)
    assert 0 < len(evaluation) < len(train) < 1000
    assert len({p.prompt for p in train}) == len(train)
    assert not {p.prompt for p in train} & {p.prompt for p in evaluation}
    assert "fewer than the 1000 asked for" in caplog.text
    assert _signature(train) == _signature(task.problems("train", 1000, seed=0))


def test_an_unknown_generator_names_the_closest_ones() -> None:
    with pytest.raises(ValueError, match=r"'chain_sums'.*closest: chain_sum.*generator_names\(\)"):
        ReasoningGymTask(generator="chain_sums")
    with pytest.raises(ValueError, match=r"'zzzz'.*no close match"):
        ReasoningGymTask(generator="zzzz")


def test_bad_params_name_the_parameter_and_what_is_accepted() -> None:
    with pytest.raises(ValueError, match=r"params\.max_term .*chain_sum.*accepts: .*max_terms"):
        ReasoningGymTask(generator="chain_sum", params={"max_term": 3})
    with pytest.raises(ValueError, match=r"params\.seed is set by the task"):
        ReasoningGymTask(generator="chain_sum", params={"seed": 3})
    with pytest.raises(ValueError, match=r"rejected params .*min_terms"):
        ReasoningGymTask(generator="chain_sum", params={"min_terms": 0})
    with pytest.raises(ValueError, match=r"params must be a table"):
        ReasoningGymTask(generator="chain_sum", params=[("max_terms", 3)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"system_prompt"):
        ReasoningGymTask(generator="chain_sum", system_prompt=" ")


def test_bad_problems_arguments() -> None:
    task = ReasoningGymTask(generator="chain_sum")
    with pytest.raises(ValueError, match="split"):
        task.problems("test", 1, seed=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="count"):
        task.problems("train", -1, seed=0)
