"""The audit of reasoning-gym's scorers against the installed package, and the grammar in front of
each one that evaluates: reference answers keep their scores, attacks are refused before a scorer
sees them (pure: nothing here starts a process or evaluates answer text)."""

from __future__ import annotations

import builtins
import copy
import functools
import importlib.metadata
import inspect
import re
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from pipelinerl.tasks import reasoning_gym_answers as answers
from pipelinerl.tasks.answer_grammar import GrammarError

with warnings.catch_warnings():
    warnings.simplefilter("ignore", SyntaxWarning)  # a dependency's "is" with a literal
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

# Names a completion could use to read a scorer's variables or reach the interpreter.
LOCALS = ["entry", "answer", "self", "oracle_answer", "valid_solutions", "metadata", "reward", "e"]
ATTACKS = [
    "__import__('os').system('touch /tmp/owned')",
    "open('/tmp/owned', 'w').write('x')",
    "__import__('socket').create_connection(('127.0.0.1', 80))",
    "__import__('os').write(1, b'[\"ok\", 1.0]\\n')",  # a forged reply
    "print('[\"ok\", 1.0]')",
    "__import__('time').sleep(90)",
    "[0] * 10 ** 10",
    "9**9**9**9",
    "sum(range(10 ** 12))",
    *LOCALS,
    *(f"[{name}]" for name in LOCALS),
    "oracle_answer.split()",
]


def _entries(generator: str, count: int, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The generator's first ``count`` entries (seed 0), a fresh copy each time: generated once, as
    the attack tests ask for the same entry of each generator once per attack."""
    return copy.deepcopy(_generated(generator, count, tuple(sorted((params or {}).items()))))


@functools.cache
def _generated(generator: str, count: int, params: tuple[tuple[str, Any], ...]) -> list[dict[str, Any]]:
    return list(reasoning_gym.create_dataset(generator, seed=0, size=count, **dict(params)))


def test_the_audit_covers_exactly_the_installed_generators() -> None:
    # A new reasoning-gym release fails here: its scorers must be read again before this passes.
    assert importlib.metadata.version("reasoning-gym") == answers.AUDITED_VERSION
    audited = set(answers.EVALUATING) | answers.NOT_EVALUATING | {answers.COMPOSITE}
    assert audited == set(DATASETS)
    assert not set(answers.EVALUATING) & answers.NOT_EVALUATING


@pytest.fixture(scope="module")
def compiled_sources() -> Iterator[list[str]]:
    sources: list[str] = []

    def hook(event: str, arguments: tuple[Any, ...]) -> None:
        if event == "compile" and arguments and isinstance(arguments[0], str | bytes):
            source = arguments[0]
            sources.append(source.decode(errors="replace") if isinstance(source, bytes) else source)

    sys.addaudithook(hook)  # cannot be removed; it only appends to this list
    yield sources


MARKER = "zqmarker"


@pytest.mark.parametrize("generator", sorted(DATASETS.keys() - {answers.COMPOSITE}))
def test_which_scorers_compile_the_answer_matches_the_audit(
    generator: str, compiled_sources: list[str]
) -> None:
    # The audit's evidence, re-run: a scorer that hands the answer to eval/exec/sympy compiles
    # source that contains it; Python reports every compile to an audit hook.
    dataset = reasoning_gym.create_dataset(generator, seed=0, size=2)  # the entries and their scorer
    entries = list(dataset)
    compiled_sources.clear()
    for entry in entries:
        probes = (MARKER, f"{MARKER} + 1", f"[{MARKER}]", f"({MARKER}, 1)", f"{entry['answer']} {MARKER}")
        for answer in probes:
            try:
                entry_copy = {**entry, "metadata": dict(entry.get("metadata", {}))}
                dataset.score_answer(answer, entry_copy)
            except Exception:
                pass
    evaluates = any(MARKER in source for source in compiled_sources)
    assert evaluates == (generator in answers.EVALUATING), generator


@pytest.mark.parametrize("generator", sorted(answers.EVALUATING))
def test_reference_answers_pass_their_grammar_and_keep_their_score(generator: str) -> None:
    dataset = reasoning_gym.create_dataset(generator, seed=0, size=40)  # generates items only when read
    for entry in _entries(generator, 40):  # its items, generated once for this test and the next
        reference = str(entry["answer"])
        if "Integral(" in reference:  # a restated integral is refused on purpose (module docstring)
            with pytest.raises(GrammarError, match="Integral"):
                answers.scorer_text(generator, reference, entry, {}, allow_unsafe=False)
            continue
        text = answers.scorer_text(generator, reference, entry, {}, allow_unsafe=False)
        assert dataset.score_answer(text, entry) == dataset.score_answer(reference, entry) == 1.0


@pytest.mark.parametrize(
    ("generator", "honest"),
    [
        # The list forms these scorers give partial credit for, rewritten as the repr of the value.
        ("binary_matrix", lambda entry: str(entry["metadata"]["solution"])),
        ("spiral_matrix", lambda entry: str(entry["metadata"]["solution"])),
        ("string_insertion", lambda entry: str(list(entry["answer"]))),
        ("n_queens", lambda entry: str([row.split() for row in entry["answer"].split("\n")])),
        # Wrong but well-formed answers.
        ("binary_matrix", lambda entry: "0 1\n1 0"),
        ("string_insertion", lambda entry: "ABCDE"),
        ("countdown", lambda entry: " + ".join(map(str, entry["metadata"]["numbers"]))),
        ("puzzle24", lambda entry: "*".join(map(str, entry["metadata"]["numbers"]))),
        ("simple_integration", lambda entry: f"{entry['metadata']['variable']}**2 + C"),
        ("polynomial_multiplication", lambda entry: "x**2 + 1"),
    ],
)
def test_other_honest_answers_keep_their_score(generator: str, honest: Any) -> None:
    dataset = reasoning_gym.create_dataset(generator, seed=0, size=10)
    scores = []
    for entry in _entries(generator, 40)[:10]:  # its items (an item depends on the seed and its index)
        answer = honest(entry)
        text = answers.scorer_text(generator, answer, entry, {}, allow_unsafe=False)
        scores.append(dataset.score_answer(text, entry))
        assert scores[-1] == dataset.score_answer(answer, entry), (generator, answer)
    assert len(set(scores)) >= 1


@pytest.mark.parametrize("generator", sorted(answers.EVALUATING))
@pytest.mark.parametrize("attack", ATTACKS)
def test_attacks_are_refused_before_any_scorer(generator: str, attack: str) -> None:
    entry = _entries(generator, 1)[0]
    with pytest.raises(GrammarError):
        answers.scorer_text(generator, attack, entry, {}, allow_unsafe=False)


@pytest.mark.parametrize("generator", sorted(answers.PLAIN_TOKENS))
def test_plain_answers_name_nothing_their_scorer_can_see(generator: str) -> None:
    # Plain answers pass unchanged, so `eval` of one is a syntax error, a number, or a lookup of a
    # name of the token form: no name of that form may exist where the scorer evaluates it.
    cls = DATASETS[generator][0]
    method = next(klass for klass in cls.__mro__ if "score_answer" in klass.__dict__).__dict__["score_answer"]
    module = sys.modules[method.__module__]
    visible = {*vars(module), *vars(builtins), *method.__code__.co_varnames, *method.__code__.co_names}
    token = re.compile(answers.PLAIN_TOKENS[generator])
    assert not [name for name in visible if token.fullmatch(name)]
    assert inspect.getsource(method).count("eval(") == 1  # the one eval the audit read


def test_an_unaudited_generator_needs_the_unsafe_option() -> None:
    entry = _entries("chain_sum", 1)[0]
    with pytest.raises(GrammarError, match="not audited"):
        answers.scorer_text("my_generator", "__import__('os')", entry, {}, allow_unsafe=False)
    assert answers.scorer_text("my_generator", "anything", entry, {}, allow_unsafe=True) == "anything"
    assert answers.scorer_text("chain_sum", "anything", entry, {}, allow_unsafe=False) == "anything"
    assert not answers.is_audited("my_generator") and answers.is_audited("chain_sum")


def test_composite_entries_use_their_generators_grammar() -> None:
    entry = {**_entries("countdown", 1)[0]}
    entry["metadata"] = {**entry["metadata"], "source_dataset": "countdown"}
    assert answers.scorer_text("composite", "1 + 2", entry, {}, allow_unsafe=False) == "1 + 2"
    with pytest.raises(GrammarError):
        answers.scorer_text("composite", "__import__('os')", entry, {}, allow_unsafe=False)
    assert answers.composite_members({"datasets": [{"name": "countdown"}]}) == ["countdown"]


def test_the_polynomial_grammar_takes_the_configured_variables() -> None:
    entry = _entries("polynomial_multiplication", 1, {"variables": ("a",)})[0]
    assert answers.scorer_text("polynomial_multiplication", "a**2", entry, {"variables": ("a",)}, False)
    with pytest.raises(GrammarError, match="name 'x'"):
        answers.scorer_text("polynomial_multiplication", "x**2", entry, {"variables": ("a",)}, False)
