"""Grading of math completions: the final answer's extraction and its math-verify check, run in a
reused worker process so that a pathological answer costs its caller at most the timeout.

Labels: no extractable answer is ``no_answer``; an answer math-verify cannot parse (or one whose
check overran the timeout) is ``unparsable``; then ``correct`` or ``wrong``.

Why a process: math-verify's own timeouts use ``SIGALRM``, which works only in the main thread,
and no signal interrupts CPython's C-level arithmetic: ``\\boxed{9^{9^{9^{9}}}}`` keeps a core busy
in ``int.__pow__`` for minutes (measured). A thread cannot be stopped; a process can be killed.
Each worker is a plain ``python -m pipelinerl.tasks.math_grading`` child that answers one JSON
line per request (no ``multiprocessing``, so the caller's ``__main__`` is never imported again).
Idle workers wait in a pool, one per concurrent caller; a worker that overruns is killed and a
fresh one is started at once, so the next call finds it ready. A worker also caps its own CPU time
per request and its memory, so it dies by itself if its parent is gone in the middle of a request.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from pipelinerl.tasks.base import Label

logger = logging.getLogger(__name__)

# A worker imports sympy and math-verify's LaTeX parser (about 1 s alone, several under CI load).
WORKER_START_TIMEOUT_S = 60.0
# CPU seconds a worker may spend on one request beyond its timeout before the kernel kills it
# (only matters when nobody is left to kill it: the parent kills it at the timeout).
WORKER_CPU_SLACK_S = 2
# The address space a worker may use: with sympy and the parser loaded it maps under 100 MB (measured),
# so only an answer whose digits would crowd the machine hits this (a MemoryError: ``unparsable``).
WORKER_MEMORY_LIMIT_BYTES = 4 << 30

_BOXED = "\\boxed{"
_BRACES = re.compile(r"[{}]")
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


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
    from math_verify import parse, verify  # sympy is loaded only by whoever grades

    answer = extract_answer(completion, answer_pattern)
    if answer is None:
        return "no_answer"
    # Both sides go through the same LaTeX path; timeouts are off here (the worker has its own).
    predicted = parse(f"\\boxed{{{answer}}}", parsing_timeout=None)
    if all(isinstance(item, str) for item in predicted):  # only the raw-string fallback, or nothing
        return "unparsable"
    return "correct" if verify(_parsed_gold(gold), predicted, timeout_seconds=None) else "wrong"


@lru_cache(maxsize=4096)
def _parsed_gold(gold: str) -> list[Any]:
    from math_verify import parse

    return parse(f"\\boxed{{{gold}}}", parsing_timeout=None)


def grade_with_timeout(completion: str, gold: str, answer_pattern: str | None, timeout_s: float) -> Label:
    """``grade`` in a worker process, ``unparsable`` when it takes longer than ``timeout_s`` (not
    counting a worker's start); never raises, works from any thread."""
    try:
        return _grade_in_worker(completion, gold, answer_pattern, timeout_s)
    except Exception as error:  # no worker could be started (out of processes, memory, ...)
        logger.warning("math grading failed (%r); scored as unparsable", error)
        return "unparsable"


def _grade_in_worker(completion: str, gold: str, answer_pattern: str | None, timeout_s: float) -> Label:
    request = {"completion": completion, "gold": gold, "pattern": answer_pattern, "timeout_s": timeout_s}
    for attempt in range(2):  # a worker found dead before it got the request is replaced once
        worker = _take_worker()
        try:
            reply = worker.ask(request, timeout_s)
        except _WorkerGone as error:
            worker.kill()
            if error.before_request and attempt == 0:
                continue
            logger.warning("math grading worker failed (%s); scored as unparsable", error)
            _return_worker(_Worker())
            return "unparsable"
        if reply is None:
            worker.kill()
            logger.warning("math grading took longer than %.1f s; scored as unparsable", timeout_s)
            _return_worker(_Worker())  # started now, so the next call finds it ready
            return "unparsable"
        _return_worker(worker)
        label = reply.get("label")
        return label if label in ("correct", "wrong", "no_answer", "unparsable") else "unparsable"
    return "unparsable"


class _WorkerGone(Exception):
    def __init__(self, message: str, before_request: bool) -> None:
        super().__init__(message)
        self.before_request = before_request


class _Worker:
    """One grading process and the parent's end of its pipes."""

    def __init__(self) -> None:
        environment = dict(os.environ)
        # The child must import this package even when the parent found it by a path of its own.
        environment["PYTHONPATH"] = os.pathsep.join(
            part for part in (str(_PACKAGE_ROOT), environment.get("PYTHONPATH", "")) if part
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pipelinerl.tasks.math_grading"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=environment,
        )
        assert self.process.stdout is not None
        self._replies = select.poll()  # not select.select: pipes past descriptor 1023 are common in an actor
        self._replies.register(self.process.stdout.fileno(), select.POLLIN)
        self.ready = False
        self._pending = b""

    def ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """The worker's reply to ``request``, or None after ``timeout_s``."""
        if not self.ready:
            if self._read_line(WORKER_START_TIMEOUT_S, before_request=True) is None:
                raise _WorkerGone(
                    f"no worker ready within {WORKER_START_TIMEOUT_S:.0f} s", before_request=False
                )
            self.ready = True
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as error:
            raise _WorkerGone(f"worker gone ({error!r})", before_request=True) from error
        return self._read_line(timeout_s, before_request=False)

    def _read_line(self, timeout_s: float, before_request: bool) -> dict[str, Any] | None:
        assert self.process.stdout is not None
        descriptor = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._replies.poll(remaining * 1000):
                return None
            chunk = os.read(descriptor, 1 << 16)
            if not chunk:
                code = self.process.poll()
                raise _WorkerGone(f"worker exited with code {code}", before_request=before_request)
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return json.loads(line)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.close_pipes()

    def close_pipes(self) -> None:
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


_pool_lock = threading.Lock()
_idle_workers: list[_Worker] = []


def _take_worker() -> _Worker:
    with _pool_lock:
        if _idle_workers:
            return _idle_workers.pop()
    return _Worker()


def _return_worker(worker: _Worker) -> None:
    with _pool_lock:
        _idle_workers.append(worker)


def _forget_inherited_workers() -> None:
    """In a forked child: the workers are the parent's; close the child's copies of their pipes
    (so that they still see the parent's exit) and start a pool of its own."""
    global _pool_lock
    _pool_lock = threading.Lock()  # another thread may have held it at the fork
    for worker in _idle_workers:
        worker.close_pipes()
    _idle_workers.clear()


os.register_at_fork(after_in_child=_forget_inherited_workers)


@atexit.register
def _stop_workers() -> None:
    with _pool_lock:
        workers = list(_idle_workers)
        _idle_workers.clear()
    for worker in workers:
        worker.kill()


def _limit_resources(timeout_s: float | None) -> None:
    """The worker's own limits: memory once, and CPU seconds for the request about to run."""
    import resource

    if timeout_s is None:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY or soft > WORKER_MEMORY_LIMIT_BYTES:
            resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_LIMIT_BYTES, hard))
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    limit = int(usage.ru_utime + usage.ru_stime + timeout_s) + WORKER_CPU_SLACK_S
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    if hard == resource.RLIM_INFINITY or limit <= hard:
        resource.setrlimit(resource.RLIMIT_CPU, (limit, hard))  # SIGXCPU past it ends the worker


def serve() -> None:
    """The worker's loop: one JSON request a line on stdin, one JSON reply a line on stdout."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever a library prints goes to stderr, never into the replies
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout disabled" notice
    grade("\\boxed{1/2}", "0.5")  # import and warm the parser before saying ready
    _limit_resources(None)
    replies.write(b'{"ready": true}\n')
    replies.flush()
    while line := sys.stdin.buffer.readline():
        request = json.loads(line)
        _limit_resources(request["timeout_s"])
        try:
            label: Label = grade(request["completion"], request["gold"], request["pattern"])
        except Exception:  # MemoryError, RecursionError, a parser bug: the answer cannot be read
            label = "unparsable"
        replies.write(json.dumps({"label": label}).encode() + b"\n")
        replies.flush()


if __name__ == "__main__":
    serve()
