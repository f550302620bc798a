"""Grading of math completions: the final answer's extraction and its math-verify check, run in
the scoring sandbox so that a pathological answer costs its caller at most the timeout.

Labels: no extractable answer is ``no_answer``; an answer math-verify cannot parse (or one whose
check overran the timeout) is ``unparsable``; then ``correct`` or ``wrong``.

Why a sandbox: math-verify parses the answer's LaTeX into sympy objects (sympy evaluates), its own
timeouts use ``SIGALRM``, which works only in the main thread, and no signal interrupts CPython's
C-level arithmetic: ``\\boxed{9^{9^{9^{9}}}}`` keeps a core busy in ``int.__pow__`` for minutes
(measured). A thread cannot be stopped; a process can be killed. Each grader is a ``Sandbox``
(``sandbox.py``): a supervisor that imports math-verify once, warms its parser, then grades every
answer in a confined evaluator forked in advance (no network, read-only file system, the user
``nobody``, memory and CPU limits, a system-call filter, a clean environment). An answer past the
timeout kills only its evaluator: the supervisor stays warm and has the next evaluator forked, so
the next answer never waits for an interpreter to start. Graders wait in a pool, one per
concurrent caller. ``grading_counts`` says how many answers timed out and how many calls waited
for a grader to start.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections import Counter
from functools import lru_cache
from typing import Any

from pipelinerl.tasks.base import LABELS, Label
from pipelinerl.tasks.sandbox import Handler, Sandbox

logger = logging.getLogger(__name__)

# A grader imports sympy and math-verify's LaTeX parser (about 1 s alone, several under CI load).
WORKER_START_TIMEOUT_S = 60.0
# The address space an evaluator may add to its grader's: parsing and checking a real answer needs
# a few MB, so only an answer whose digits would crowd the machine hits this (MemoryError:
# ``unparsable``).
WORKER_MEMORY_LIMIT_BYTES = 2 << 30

# The forms of answers and references the grader is warmed up on (``sandbox.Handler``): integers,
# decimals, fractions, signs, roots, thousands separators, tuples and polynomials, each a parser path.
_WARM_UP_ANSWERS = (
    ("3", "3"),
    ("1/2", "0.5"),
    ("\\frac{1}{2}", "\\dfrac{2}{4}"),
    ("-2.5", "-5/2"),
    ("\\sqrt{2}", "\\frac{2}{\\sqrt{2}}"),
    ("1,000", "1000"),
    ("(1, 2)", "(1,2)"),
    ("x^2 + 1", "1 + x^2"),
)
_BOXED = "\\boxed{"
_BRACES = re.compile(r"[{}]")


def last_boxed(text: str) -> str | None:
    """The content of the last complete, non-empty ``\\boxed{...}`` of ``text`` (nested braces
    included), or None. An unclosed box (a truncated completion) and ``\\boxed{}`` are skipped."""
    end = len(text)  # the next box starts before this
    # A box that starts before an unclosed one closes before that one starts or never, so its
    # search stops there: linear time even for a completion of unclosed boxes.
    limit = len(text)
    while (start := text.rfind(_BOXED, 0, end)) >= 0:
        content_start = start + len(_BOXED)
        close = _closing_brace(text, content_start, limit)
        if close is None:
            limit = start
        elif text[content_start:close].strip():
            return text[content_start:close].strip()
        end = start
    return None


def _closing_brace(text: str, start: int, limit: int) -> int | None:
    """Where the brace opened just before ``start`` closes, searching up to ``limit``; None if not."""
    depth = 1
    for brace in _BRACES.finditer(text, start, limit):
        depth += 1 if brace.group() == "{" else -1
        if depth == 0:
            return brace.start()
    return None


def extract_answer(completion: str, answer_pattern: str | None = None) -> str | None:
    """The completion's final answer: the last ``\\boxed{}``, or the group of the last match of
    ``answer_pattern`` (a regex with one group); None when there is none or it is blank."""
    if answer_pattern is None:
        return last_boxed(completion)
    matches = list(re.finditer(answer_pattern, completion))
    if not matches or matches[-1].group(1) is None or not matches[-1].group(1).strip():
        return None
    return matches[-1].group(1).strip()


def grade(completion: str, gold: str, answer_pattern: str | None = None) -> Label:
    """The label of ``completion`` against the reference answer ``gold``, without a time limit
    (``grade_with_timeout`` adds one)."""
    from math_verify import parse, verify  # noqa: PLC0415 (sympy: loaded only by whoever grades)

    answer = extract_answer(completion, answer_pattern)
    if answer is None:
        return "no_answer"
    # Both sides go through the same LaTeX path; timeouts are off here (the sandbox has its own).
    predicted = parse(f"\\boxed{{{answer}}}", parsing_timeout=None)
    if all(isinstance(item, str) for item in predicted):  # only the raw-string fallback, or nothing
        return "unparsable"
    return "correct" if verify(_parsed_gold(gold), predicted, timeout_seconds=None) else "wrong"


@lru_cache(maxsize=4096)
def _parsed_gold(gold: str) -> list[Any]:
    from math_verify import parse  # noqa: PLC0415 (sympy: loaded only by whoever grades)

    return parse(f"\\boxed{{{gold}}}", parsing_timeout=None)


def grade_with_timeout(completion: str, gold: str, answer_pattern: str | None, timeout_s: float) -> Label:
    """``grade`` in the sandbox, ``unparsable`` when it takes longer than ``timeout_s`` (not counting
    a grader's start); never raises, works from any thread."""
    grader = _take_grader()
    try:
        outcome = grader.call({"completion": completion, "gold": gold, "pattern": answer_pattern}, timeout_s)
    finally:
        _return_grader(grader)  # after a timeout too: only the evaluator was killed
    if outcome.status == "ok" and outcome.value in LABELS:
        return outcome.value  # type: ignore[no-any-return]
    _counts[outcome.status] += 1
    if outcome.status == "timeout":
        logger.warning("math grading took longer than %.1f s; scored as unparsable", timeout_s)
    elif outcome.status != "error":  # error: the parser choked (MemoryError, RecursionError, a bug)
        logger.warning("math grading %s (%s); scored as unparsable", outcome.status, outcome.detail)
    return "unparsable"


def sandboxed_grader(args: None) -> Handler:
    """The sandbox's setup (run in its supervisor): ``grade`` of one request, with the parser
    warmed up on a sample (``sandbox.Handler``)."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout disabled" notice

    def score(request: dict[str, Any]) -> Label:
        if request.get("warm_up"):  # also the parse of a new reference, which the cache would skip
            _parsed_gold.__wrapped__(request["gold"])
        return grade(request["completion"], request["gold"], request["pattern"])

    return Handler(
        score,
        tuple(
            {"completion": f"\\boxed{{{answer}}}", "gold": gold, "pattern": None, "warm_up": True}
            for answer, gold in _WARM_UP_ANSWERS
        ),
    )


def grading_counts() -> dict[str, int]:
    """Since this process started: graders started, calls that waited for one to come up, and the
    answers that were not graded, by outcome (timeout, crashed, refused, failed, error)."""
    with _pool_lock:
        graders = [*_idle_graders, *_busy_graders]  # a pool only grows: none is ever dropped
        started = sum(grader.starts for grader in graders)
        waits = sum(grader.start_waits for grader in graders)
        return {"graders_started": started, "start_waits": waits, **_counts}


_pool_lock = threading.Lock()
_idle_graders: list[Sandbox] = []
_busy_graders: list[Sandbox] = []
_counts: Counter[str] = Counter()


def _take_grader() -> Sandbox:
    with _pool_lock:
        grader = _idle_graders.pop() if _idle_graders else None
        if grader is None:
            grader = Sandbox(
                f"{__name__}:sandboxed_grader",
                None,
                name="math grading",
                memory_bytes=WORKER_MEMORY_LIMIT_BYTES,
                start_timeout_s=WORKER_START_TIMEOUT_S,
            )
        _busy_graders.append(grader)
        return grader


def _return_grader(grader: Sandbox) -> None:
    with _pool_lock:
        _busy_graders.remove(grader)
        _idle_graders.append(grader)


def _forget_inherited_graders() -> None:
    """In a forked child: the graders are the parent's (``sandbox`` closes the child's copies of
    their pipes); start a pool of its own."""
    global _pool_lock
    _pool_lock = threading.Lock()  # another thread may have held it at the fork
    _idle_graders.clear()
    _busy_graders.clear()


os.register_at_fork(after_in_child=_forget_inherited_graders)
