"""The math task: math-verify scoring with a hard timeout, the shipped set, the dataset layouts
(JSONL, Parquet, split directories, saved Hugging Face datasets) and every bad-input message."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from pipelinerl.tasks import TaskError, get_task, math_grading
from pipelinerl.tasks.base import Label, Message, Problem
from pipelinerl.tasks.math import DEFAULT_INSTRUCTION, MathTask
from pipelinerl.tasks.math_data import SHIPPED_PATH, generate, render
from pipelinerl.tasks.math_grading import last_boxed

# A power tower: CPython's int.__pow__ computes it for minutes and no signal interrupts it.
SLOW_ANSWER = "\\boxed{9^{9^{9^{9}}}}"

GSM8K_RECORDS = [
    {
        "question": f"Natalia sold clips to {n} friends in April, and half as many in May. How many in all?",
        "answer": f"In May she sold {n}/2 = <<{n}/2={n // 2}>>{n // 2} clips.\n"
        f"In all she sold {n}+{n // 2} = <<{n}+{n // 2}={n + n // 2}>>{n + n // 2} clips.\n"
        f"#### {n + n // 2:,}",
    }
    for n in range(1000, 1040, 2)
]
MATH_RECORDS = [
    {
        "problem": f"What is $\\frac{{1}}{{{n}}} + \\frac{{1}}{{{n}}}$?",
        "solution": f"Adding gives $\\frac{{2}}{{{n}}} = \\boxed{{\\frac{{2}}{{{n}}}}}$.",
        "level": "Level 1",
    }
    for n in range(3, 23)
]


def problem(answer: str) -> Problem:
    return Problem(problem_id="math-test", prompt="", answer=answer)


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


@pytest.fixture(scope="module")
def task() -> MathTask:
    return MathTask()


GradeHere = Callable[[MathTask, Problem, str], Label]


@pytest.fixture(scope="module")
def grade_here() -> GradeHere:
    """``MathTask.score``'s label computed in this process: the grader's own function and timeout
    without the sandbox's fork per answer (about 15 ms, nearly all the cost of scoring hundreds of
    answers). The tests that use it still send a sample through ``score``."""
    math_grading.grade("\\boxed{1}", "1")  # imports math-verify and builds its parser, untimed as in a grader

    def grade(task: MathTask, problem: Problem, completion: str) -> Label:
        start = time.monotonic()
        label = math_grading.grade(completion, problem.answer, task.answer_pattern)
        return label if time.monotonic() - start <= task.score_timeout_s else "unparsable"

    return grade


# --- scoring -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("So $x = \\boxed{0.5}$.", "\\frac{1}{2}"),
        ("\\boxed{1/2}", "0.5"),
        ("\\boxed{\\frac{1}{2}}", "1/2"),
        ("\\boxed{\\dfrac{3}{4}}", "0.75"),
        ("\\boxed{-\\frac{7}{3}}", "-7/3"),
        ("\\boxed{12.50}", "12.5"),
        ("\\boxed{1,000}", "1000"),
        ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt2}{2}"),  # nested braces
        ("\\boxed{{\\frac{1}{2}}}", "0.5"),
        ("first \\boxed{3}, then on reflection \\boxed{4}", "4"),  # the last box counts
        ("\\boxed{4} as asked, inside \\boxed{}", "4"),  # an empty box is not an answer
    ],
)
def test_equivalent_forms_are_correct(task: MathTask, completion: str, answer: str) -> None:
    score = task.score(problem(answer), completion)
    assert (score.label, score.reward) == ("correct", 1.0)


@pytest.mark.parametrize(
    ("completion", "answer", "label"),
    [
        ("first \\boxed{3}, then on reflection \\boxed{4}", "3", "wrong"),
        ("\\boxed{0.49}", "1/2", "wrong"),
        ("\\boxed{-3}", "3", "wrong"),
        ("", "3", "no_answer"),
        ("The answer is 3.", "3", "no_answer"),
        ("\\boxed{}", "3", "no_answer"),
        ("truncated: \\boxed{\\frac{1}{2", "1/2", "no_answer"),
        ("\\boxed{\\frac{1}{}}", "1/2", "unparsable"),
        ("\\boxed{(}", "3", "unparsable"),
        ("\\boxed{\\sqrt{}}", "3", "unparsable"),
    ],
)
def test_wrong_missing_and_malformed_answers(
    task: MathTask, completion: str, answer: str, label: str
) -> None:
    score = task.score(problem(answer), completion)
    assert (score.label, score.reward) == (label, 0.0)


def test_last_boxed_handles_nesting_and_truncation() -> None:
    assert last_boxed("\\boxed{\\frac{\\sqrt{2}}{2}}") == "\\frac{\\sqrt{2}}{2}"
    assert last_boxed("\\boxed{1} and \\boxed{2}") == "2"
    assert last_boxed("\\boxed{1} and then \\boxed{2") == "1"  # an unclosed box is skipped
    assert last_boxed("no box") is None
    assert last_boxed("\\boxed{x \\boxed{} y}") == "x \\boxed{} y"


def test_a_completion_of_unclosed_boxes_has_no_answer(task: MathTask) -> None:
    # Linear search: 50,000 unclosed boxes are read well within the timeout.
    assert task.score(problem("3"), "\\boxed{" * 50_000).label == "no_answer"


def test_an_answer_pattern_replaces_the_box() -> None:
    task = MathTask(answer_pattern=r"Answer:\s*(\S+)")
    assert task.score(problem("0.5"), "work...\nAnswer: 1/2").label == "correct"
    assert task.score(problem("0.5"), "Answer: 1/3\nAnswer: 2/4").label == "correct"
    assert task.score(problem("0.5"), "\\boxed{1/2}").label == "no_answer"


def _children() -> set[int]:
    """The processes this one started that are still running (not zombies)."""
    children = set()
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            children.add(int(entry.name))
    return children


def test_a_slow_answer_is_cut_at_the_timeout_from_any_thread_and_costs_no_start() -> None:
    task = MathTask(score_timeout_s=0.5)
    slow = problem("3")
    assert task.score(slow, "\\boxed{3}").label == "correct"  # a grader is up
    children = _children()
    assert task.score(slow, SLOW_ANSWER).label == "unparsable"
    assert task.score(slow, "\\boxed{3}").label == "correct"
    with ThreadPoolExecutor(max_workers=1) as thread:  # math-verify's own timeouts fail off the main thread
        assert thread.submit(task.score, slow, SLOW_ANSWER).result().label == "unparsable"
        assert thread.submit(task.score, slow, "\\boxed{3}").result().label == "correct"
    # Only the evaluators were killed: the graders this process started are the same processes.
    assert _children() == children


def test_a_timed_out_answer_is_counted_and_the_next_one_waits_for_no_start() -> None:
    task = MathTask(score_timeout_s=0.5)
    assert task.score(problem("3"), "\\boxed{3}").label == "correct"  # a grader is up
    before = math_grading.grading_counts()
    assert task.score(problem("3"), SLOW_ANSWER).label == "unparsable"
    assert task.score(problem("3"), "\\boxed{3}").label == "correct"
    after = math_grading.grading_counts()
    assert after["timeout"] == before.get("timeout", 0) + 1
    for count in ("graders_started", "start_waits"):
        assert after[count] == before[count], count


@pytest.mark.skipif(os.geteuid() != 0, reason="the full isolation needs root")
def test_grading_runs_confined() -> None:
    assert MathTask().score(problem("3"), "\\boxed{3}").label == "correct"
    graders = list(math_grading._idle_graders)
    assert graders and all(grader.isolation is not None and grader.isolation.complete for grader in graders)


def test_scoring_garbage_never_raises(task: MathTask) -> None:
    for completion in [
        "\\boxed{" * 50,
        "}" * 50 + "\\boxed{x}",
        "\x00\udcff",
        "\\boxed{\\frac{\\frac{}{}}{}}",
        "a" * 100_000,
    ]:
        assert task.score(problem("3"), completion).label in ("wrong", "no_answer", "unparsable")


# --- the shipped set -----------------------------------------------------------------------------


def test_the_shipped_file_is_what_the_generator_writes() -> None:
    text = SHIPPED_PATH.read_text(encoding="utf-8")
    assert text == render(generate())
    assert len(text.encode()) < 300_000


def test_shipped_splits_are_disjoint_deterministic_and_large_enough(task: MathTask) -> None:
    train, evaluation = task.problems("train", 10_000, seed=0), task.problems("eval", 10_000, seed=0)
    assert len(train) + len(evaluation) >= 300 and len(evaluation) >= 20
    assert not {p.problem_id for p in train} & {p.problem_id for p in evaluation}
    assert not {p.prompt for p in train} & {p.prompt for p in evaluation}
    assert len({p.problem_id for p in train}) == len(train)
    assert task.problems("train", 50, seed=3) == task.problems("train", 50, seed=3)
    assert task.problems("train", 50, seed=3) != task.problems("train", 50, seed=4)
    assert task.problems("train", 80, seed=3)[:40] == task.problems("train", 40, seed=3)
    assert MathTask().problems("eval", 10, seed=1) == task.problems(
        "eval", 10, seed=1
    )  # ids stable across builds
    assert task.problems("eval", 0, seed=0) == []


def test_shipped_answers_come_in_many_forms(task: MathTask) -> None:
    answers = [p.answer for p in task.problems("train", 10_000, seed=0)]
    assert any("\\frac" in a for a in answers) and any(a.startswith("-") for a in answers)
    assert any("." in a for a in answers) and any(a.isdigit() for a in answers)


def test_every_shipped_reference_completion_is_correct(task: MathTask, grade_here: GradeHere) -> None:
    problems = task.problems("train", 10_000, seed=0) + task.problems("eval", 10_000, seed=0)
    for p in problems:
        completion = task.reference_completion(p)
        assert completion.endswith(f"\\boxed{{{p.answer}}}")
        assert grade_here(task, p, completion) == "correct", (p.prompt, completion)
    for p in problems[::40]:  # the sandboxed scorer agrees
        assert task.score(p, task.reference_completion(p)).label == "correct", p.prompt


def test_prompt_and_messages(task: MathTask) -> None:
    shipped = task.problems("train", 1, seed=0)[0]
    question = shipped.prompt.removesuffix(f"\n\n{DEFAULT_INSTRUCTION}")
    assert question != shipped.prompt and shipped.messages == (Message("user", shipped.prompt),)
    custom = MathTask(instruction="", system_prompt="You are a careful mathematician.")
    with_system = next(
        p for p in custom.problems("train", 10_000, seed=0) if p.problem_id == shipped.problem_id
    )
    assert with_system.prompt == question
    assert with_system.messages == (
        Message("system", "You are a careful mathematician."),
        Message("user", question),
    )
    assert task.stop_strings == ()


def test_the_registry_builds_it() -> None:
    assert get_task("math", eval_fraction=0.2).name == "math"


# --- dataset layouts -----------------------------------------------------------------------------


def test_gsm8k_layout_in_jsonl(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_RECORDS)
    task = MathTask(
        dataset=str(path),
        question_field="question",
        answer_field="answer",
        solution_field="answer",
        answer_format="gsm8k",
    )
    problems = task.problems("train", 100, seed=0) + task.problems("eval", 100, seed=0)
    assert len(problems) == len(GSM8K_RECORDS)
    first = next(p for p in problems if "to 1000 friends" in p.prompt)
    assert first.answer == "1500"  # the thousands comma of '#### 1,500' is dropped
    completion = task.reference_completion(first)
    assert "<<" not in completion and "####" not in completion and completion.endswith("\\boxed{1500}")
    assert task.score(first, completion).label == "correct"


def test_math_layout_answer_from_the_boxed_solution(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "math.jsonl", MATH_RECORDS)
    task = MathTask(dataset=str(path), answer_field="solution", answer_format="boxed")
    first = next(
        p
        for p in task.problems("train", 100, seed=0) + task.problems("eval", 100, seed=0)
        if "{3}" in p.prompt
    )
    assert first.answer == "\\frac{2}{3}"
    assert task.score(first, task.reference_completion(first)).label == "correct"
    assert task.score(first, "\\boxed{2/3}").label == "correct"


def test_aime_layout_integer_answers_without_solutions(tmp_path: Path) -> None:
    records = [
        {"id": n, "problem": f"Find the remainder of {n}^2 divided by 1000.", "answer": n * n % 1000}
        for n in range(50)
    ]
    task = MathTask(dataset=str(write_jsonl(tmp_path / "aime.jsonl", records)))
    first = task.problems("train", 1, seed=0)[0]
    assert first.answer.isdigit() and task.score(first, f"\\boxed{{{first.answer}}}").label == "correct"
    with pytest.raises(ValueError, match="has no worked solutions .*solution_field='solution'"):
        task.reference_completion(first)


def test_hash_split_is_disjoint_and_covers_everything(tmp_path: Path) -> None:
    records = [{"problem": f"What is {n} + 1?", "answer": n + 1} for n in range(200)]
    task = MathTask(dataset=str(write_jsonl(tmp_path / "sums.jsonl", records)), eval_fraction=0.3)
    train, evaluation = task.problems("train", 500, seed=0), task.problems("eval", 500, seed=9)
    assert len(train) + len(evaluation) == 200 and 30 <= len(evaluation) <= 90
    assert not {p.problem_id for p in train} & {p.problem_id for p in evaluation}


def test_a_directory_with_train_and_test_files_gives_the_splits(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", MATH_RECORDS[:15] + MATH_RECORDS[19:])
    write_jsonl(tmp_path / "test.jsonl", MATH_RECORDS[15:])  # the last one is in both files
    task = MathTask(dataset=str(tmp_path), answer_field="solution", answer_format="boxed")
    train, evaluation = task.problems("train", 100, seed=0), task.problems("eval", 100, seed=0)
    assert len(train) == 15 and len(evaluation) == 5  # a problem in both stays in eval only


def test_a_split_field_gives_the_splits(tmp_path: Path) -> None:
    records = [
        {"problem": f"What is {n} + 2?", "answer": n + 2, "split": "test" if n < 4 else "train"}
        for n in range(10)
    ]
    task = MathTask(dataset=str(write_jsonl(tmp_path / "split.jsonl", records)), split_field="split")
    assert len(task.problems("eval", 100, seed=0)) == 4 and len(task.problems("train", 100, seed=0)) == 6


def test_parquet_file(tmp_path: Path) -> None:
    pyarrow = pytest.importorskip("pyarrow", reason="pyarrow is not installed")
    parquet = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed")

    records = [
        {"problem": r["problem"], "solution": r["solution"], "answer": last_boxed(r["solution"])}
        for r in MATH_RECORDS
    ]
    parquet.write_table(pyarrow.Table.from_pylist(records), tmp_path / "math500.parquet")
    task = MathTask(dataset=str(tmp_path / "math500.parquet"))  # MATH-500's fields are the defaults
    problems = task.problems("train", 100, seed=0) + task.problems("eval", 100, seed=0)
    assert len(problems) == len(MATH_RECORDS)
    assert all(task.score(p, task.reference_completion(p)).label == "correct" for p in problems)


def test_saved_hugging_face_datasets(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets", reason="the datasets package is not installed")
    split = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(GSM8K_RECORDS[:15]),
            "test": datasets.Dataset.from_list(GSM8K_RECORDS[15:]),
        }
    )
    split.save_to_disk(str(tmp_path / "gsm8k"))
    task = MathTask(dataset=str(tmp_path / "gsm8k"), question_field="question", answer_format="gsm8k")
    assert len(task.problems("train", 100, seed=0)) == 15 and len(task.problems("eval", 100, seed=0)) == 5
    datasets.Dataset.from_list(MATH_RECORDS).save_to_disk(str(tmp_path / "math"))
    task = MathTask(dataset=str(tmp_path / "math"), answer_field="solution", answer_format="boxed")
    assert len(task.problems("train", 100, seed=0)) + len(task.problems("eval", 100, seed=0)) == len(
        MATH_RECORDS
    )


# --- bad input -----------------------------------------------------------------------------------


def test_dataset_errors_name_the_file_and_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'/no/such.jsonl': no such file or directory; give 'shipped'"):
        MathTask(dataset="/no/such.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="empty.jsonl' is empty: it holds no records"):
        MathTask(dataset=str(tmp_path / "empty.jsonl"))
    gsm8k = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_RECORDS)
    with pytest.raises(
        ValueError,
        match=r"gsm8k.jsonl line 1 has no field 'problem' \(question_field\); fields found: answer, question",
    ):
        MathTask(dataset=str(gsm8k))
    with pytest.raises(
        ValueError, match=r"line 1 has no field 'final' \(answer_field\); fields found: answer, question"
    ):
        MathTask(dataset=str(gsm8k), question_field="question", answer_field="final")
    with pytest.raises(
        ValueError, match="line 1: answer_format='gsm8k' needs '#### <answer>' in field 'answer'"
    ):
        write_jsonl(tmp_path / "plain.jsonl", [{"problem": "1+1?", "answer": "2"}])
        MathTask(dataset=str(tmp_path / "plain.jsonl"), answer_format="gsm8k")
    with pytest.raises(ValueError, match=r"unsupported file type '\.csv'; valid: \.jsonl, \.parquet"):
        (tmp_path / "data.csv").write_text("problem,answer\n1+1?,2\n")
        MathTask(dataset=str(tmp_path / "data.csv"))
    with pytest.raises(ValueError, match="bad.jsonl line 2 is not JSON"):
        (tmp_path / "bad.jsonl").write_text('{"problem": "1+1?", "answer": 2}\n{"problem": \n')
        MathTask(dataset=str(tmp_path / "bad.jsonl"))
    with pytest.raises(ValueError, match="holds neither train.jsonl"):
        (tmp_path / "nothing").mkdir()
        MathTask(dataset=str(tmp_path / "nothing"))
    with pytest.raises(
        ValueError, match="split_field 'split' is 'dev'; valid values: train, test, eval, validation"
    ):
        write_jsonl(tmp_path / "dev.jsonl", [{"problem": "1+1?", "answer": 2, "split": "dev"}])
        MathTask(dataset=str(tmp_path / "dev.jsonl"), split_field="split")
    with pytest.raises(TaskError, match="task 'math': .*no such file"):  # the registry passes it on
        get_task("math", dataset=str(tmp_path / "missing.jsonl"))


def test_missing_optional_packages_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "math.parquet").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # as if pyarrow were not installed
    with pytest.raises(ValueError, match="needs the pyarrow package"):
        MathTask(dataset=str(tmp_path / "math.parquet"))
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "dataset_dict.json").write_text('{"splits": ["train"]}')
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ValueError, match="needs the datasets package"):
        MathTask(dataset=str(tmp_path / "saved"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dataset": ""}, "dataset must be 'shipped' or the path"),
        ({"question_field": ""}, "question_field must be a field name, got ''"),
        ({"answer_field": 3}, "answer_field must be a field name, got 3"),
        ({"solution_field": ""}, "solution_field must be a field name, or None, got ''"),
        ({"answer_format": "latex"}, "answer_format must be one of plain, gsm8k, boxed, got 'latex'"),
        ({"answer_pattern": "("}, r"answer_pattern '\(' is not a valid regex"),
        ({"answer_pattern": "Answer: \\d+"}, "has 0 groups; it needs exactly one"),
        ({"instruction": None}, "instruction must be text"),
        ({"system_prompt": 5}, "system_prompt must be text or None, got 5"),
        ({"score_timeout_s": 0}, "score_timeout_s must be a number of seconds > 0, got 0"),
        ({"score_timeout_s": "2"}, "score_timeout_s must be a number of seconds > 0, got '2'"),
        ({"eval_fraction": 1.0}, "eval_fraction must be a number strictly between 0 and 1, got 1.0"),
    ],
)
def test_option_errors_name_the_option_and_the_valid_values(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MathTask(**options)


def test_bad_calls(task: MathTask) -> None:
    with pytest.raises(ValueError, match="split must be 'train' or 'eval', got 'test'"):
        task.problems("test", 1, seed=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="count must be >= 0"):
        task.problems("train", -1, seed=0)
    with pytest.raises(ValueError, match="not in the math dataset 'shipped'"):
        task.reference_completion(problem("1"))


def test_a_generated_dataset_extends_the_shipped_set_in_memory():
    task = get_task("math", dataset="generated:2000")
    shipped = get_task("math")
    train, held_out = task.problems("train", 5000, 0), task.problems("eval", 5000, 0)
    assert len(train) + len(held_out) == 2000
    assert {p.problem_id for p in shipped.problems("eval", 500, 0)} <= {p.problem_id for p in held_out}
    for bad in ("generated:0", "generated:many", "generated:999999999"):
        with pytest.raises(TaskError, match="generated:<count>"):
            get_task("math", dataset=bad)


def test_a_generated_dataset_of_some_topics_only():
    task = get_task("math", dataset="generated:300:power,what_percent")
    problems = task.problems("train", 1000, 0) + task.problems("eval", 1000, 0)
    assert len(problems) == 300
    assert all(p.prompt.startswith("Compute $") or "is what percent of" in p.prompt for p in problems)
    with pytest.raises(TaskError, match=r"valid topics are fraction_sum, .*sharing_word_problem"):
        get_task("math", dataset="generated:300:powers")


def test_the_column_topics_are_sums_worked_by_columns_and_checked_by_equivalence(grade_here: GradeHere):
    """The topics a tiny model can learn (configs/math_columns.toml): every reference completion
    scores correct; a fraction sum is boxed unreduced and still matches its reference in lowest terms."""
    topics = "column_sum,same_denominator_sum,missing_addend"
    task = get_task("math", dataset=f"generated:600:{topics}", instruction="")
    problems = task.problems("train", 600, 0) + task.problems("eval", 600, 0)
    assert len(problems) == 600
    kinds = {p.prompt.split("$")[0] for p in problems}
    assert kinds == {"Compute ", "Solve for "}
    unreduced = 0
    for problem in problems:
        completion = task.reference_completion(problem)
        assert "By columns, right to left:" in completion
        assert grade_here(task, problem, completion) == "correct", (problem.prompt, completion)
        boxed = completion.rsplit("\\boxed{", 1)[1][:-1]
        unreduced += boxed != problem.answer
    assert unreduced > 50, "fraction sums whose boxed form differs from the reference's"
    for problem in problems[::50]:  # the sandboxed scorer agrees
        assert task.score(problem, task.reference_completion(problem)).label == "correct", problem.prompt
    wrong = task.reference_completion(problems[0]).rsplit("\\boxed{", 1)[0] + "\\boxed{-1}"
    assert task.score(problems[0], wrong).label == "wrong"
