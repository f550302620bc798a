"""The scoring sandbox: code that may evaluate answer text runs only in a forked, confined
evaluator whose one way out is a size-capped reply on a pipe of its own, read with a deadline.

Structure. ``Sandbox`` (in the scoring process) starts a supervisor: a child with a clean
environment (``_ENVIRONMENT``) that enters its own network and mount namespaces, imports the
scorer (``setup``, a ``"module:function"`` called once with ``args``, returning a ``Handler``),
warms it up, makes every mount read-only and from then on evaluates nothing itself. It stays the
caller's user (root in CI) inside those namespaces, so that it can start evaluators as ``nobody``
and kill them. For each request it hands the request to an evaluator forked in advance (the spare,
which has confined and warmed itself while it waited), reads the reply until the deadline, replies
to the caller, kills the evaluator (reaped later: unmapping a forked interpreter takes
milliseconds) and forks the next spare. An evaluator confines itself before it reads its request
(``confinement.py``): resource limits, the user ``nobody`` (when the supervisor is root), a
seccomp filter (no processes, threads, sockets, signals to others, ``exec``); then it scores the
request, writes one JSON reply, closes its pipe and exits.

What it guarantees:

* Answer text is evaluated only inside an evaluator: no network, no writable file system, not
  root, CPU, memory, file-size and descriptor limits, no other process reachable.
* A reply belongs to its request: each evaluator has its own pair of pipes and scores exactly one
  request; it never holds the supervisor's pipes, so bytes it writes can only decide its own
  request's outcome. Replies are JSON (never unpickled), capped at ``MAX_REPLY_BYTES``, and the
  caller checks the sequence number of each.
* Every read of a peer that may stall has a deadline (non-blocking descriptors and ``poll``, never
  a blocking line read): an evaluator past its timeout is killed (``timeout``); a supervisor that
  does not answer within the timeout plus ``SUPERVISOR_SLACK_S`` is killed and another is started
  at once, in the background. (The supervisor waits for the caller's next request without one.)
* A timed-out request costs its timeout and a fork, never an interpreter's start.

What it does not guarantee: that code running in an evaluator cannot decide its own request's
score (it writes the reply), hence the strict grammars in front of every scorer that evaluates
(``answer_grammar.py``); that it cannot read what ``nobody`` may read or see other processes'
command lines; isolation the machine does not allow (not root: the caller's user is kept; no
namespaces in a restricted container: shared network and writable files): ``Isolation`` says what
was obtained and each missing part is logged once as a warning.

Cost (measured on a loaded 2-core machine): per answer arriving while the spare waits, about 2 ms
(reasoning-gym's ``spell_backward``) to 6-8 ms (``countdown``, math-verify); back to back, 10-25 ms,
since every answer costs the supervisor a fork (a forked interpreter with sympy loaded takes about
4 ms to fork and 8 ms to unmap here). One long-lived child answered in 0.1-1.4 ms before.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import importlib
import json
import logging
import math
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipelinerl.tasks import confinement

logger = logging.getLogger(__name__)

Status = Literal["ok", "error", "timeout", "crashed", "refused", "failed"]

# Memory an evaluator may map beyond what the supervisor maps at its fork: sympy's simplification of
# a real answer stays under 200 MB; an answer needing gigabytes is not one (MemoryError: ``error``).
EVALUATOR_MEMORY_BYTES = 2 << 30
# Descriptors an evaluator may hold: its two pipes, three standard ones, and a few for lazy imports.
EVALUATOR_OPEN_FILES = 32
# CPU seconds beyond the timeout before the kernel ends an evaluator nobody killed (a supervisor gone).
EVALUATOR_CPU_SLACK_S = 2
# A reply larger than this is no score (a score is a number or a short label): refused unread.
MAX_REPLY_BYTES = 64 << 10
# The supervisor's own reply framing carries one evaluator reply plus a little JSON around it.
_MAX_FRAME_BYTES = MAX_REPLY_BYTES + 4096
# Beyond a request's timeout, how long the supervisor may take to kill, reap and reply (milliseconds
# when idle; seconds only on a machine too loaded to schedule it) before it is taken for stuck.
SUPERVISOR_SLACK_S = 10.0
# A warm-up (see ``Handler``) that takes longer than this is not repeated in every evaluator: it
# would cost more than the page copies it saves (5 to 10 ms measured) when requests come back to back.
WARM_UP_LIMIT_S = 0.02
# A supervisor imports the scorer's libraries (reasoning-gym: about 3 s idle, far more under load).
START_TIMEOUT_S = 120.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_PROGRAM = (
    "import sys; sys.path.insert(0, {root!r}); from pipelinerl.tasks.sandbox import _supervise; _supervise()"
)
# The environment of a supervisor and its evaluators: nothing of the caller's but the hash seed
# (scores stay as reproducible as the caller's), one thread per numeric library (fork-safe).
_ENVIRONMENT = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_FRAME_HEADER = struct.Struct(">I")


@dataclass(frozen=True)
class Outcome:
    """One request's result: ``ok`` with the scorer's value; ``error`` (the scorer raised: detail);
    ``timeout`` (evaluator killed at the deadline); ``crashed`` (it died without a reply: a limit, a
    signal); ``refused`` (its reply broke the protocol); ``failed`` (the supervisor did)."""

    status: Status
    value: Any = None
    detail: str = ""


@dataclass(frozen=True)
class Handler:
    """What a ``setup`` function may return instead of a bare function: ``score`` scores one
    request; ``warm_up`` holds trusted requests like the real ones (the generator's own reference
    answers, say). The supervisor scores them twice before the file system becomes read-only: lazy
    imports and the caches parsers fill on first use (ANTLR's DFA, sympy's) are then inherited by
    every evaluator instead of rebuilt in each. When the second round took under
    ``WARM_UP_LIMIT_S``, each evaluator also scores them while it waits for its real request: a
    fresh fork first writes to pages it shares with the supervisor (reference counts), and copying
    them cost several ms per request (measured: over a thousand page copies for math-verify)."""

    score: Callable[[Any], Any]
    warm_up: tuple[Any, ...] = ()


class SandboxStartError(RuntimeError):
    """The supervisor did not come up (its setup raised, or it was not ready in time)."""


# --- framing with deadlines --------------------------------------------------------------------


def _wait(descriptor: int, events: int, deadline: float | None) -> None:
    poller = select.poll()  # not select.select: descriptors past 1023 are common in an actor
    poller.register(descriptor, events)
    while True:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if poller.poll(None if remaining is None else remaining * 1000):
            return
        if remaining is not None and remaining <= 0:
            raise TimeoutError("deadline passed")


def _readable(descriptor: int) -> bool:
    poller = select.poll()
    poller.register(descriptor, select.POLLIN)
    return bool(poller.poll(0))


def _write_all(descriptor: int, data: bytes, deadline: float | None) -> None:
    view = memoryview(data)
    while view:
        _wait(descriptor, select.POLLOUT, deadline)
        try:
            view = view[os.write(descriptor, view) :]
        except BlockingIOError:
            continue


def _read_exact(descriptor: int, size: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        _wait(descriptor, select.POLLIN, deadline)
        try:
            chunk = os.read(descriptor, remaining)
        except BlockingIOError:
            continue
        if not chunk:
            raise EOFError("the other end closed")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _read_frame(descriptor: int, deadline: float | None, limit: int | None) -> bytes:
    (size,) = _FRAME_HEADER.unpack(_read_exact(descriptor, _FRAME_HEADER.size, deadline))
    if limit is not None and size > limit:
        raise ValueError(f"a frame of {size} bytes, over the {limit} allowed")
    return _read_exact(descriptor, size, deadline)


def _write_frame(descriptor: int, payload: bytes, deadline: float | None) -> None:
    _write_all(descriptor, _FRAME_HEADER.pack(len(payload)) + payload, deadline)


def _read_to_end(descriptor: int, limit: int, deadline: float) -> tuple[bytes, str]:
    """What the descriptor gives until it closes: (data, "eof" | "timeout" | "overflow")."""
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            _wait(descriptor, select.POLLIN, deadline)
            chunk = os.read(descriptor, limit + 1 - size)
        except TimeoutError:
            return b"".join(chunks), "timeout"
        except BlockingIOError:
            continue
        if not chunk:
            return b"".join(chunks), "eof"
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks), "overflow"


# --- the supervisor and its evaluators (child side) ---------------------------------------------


class _Evaluator:
    """A forked evaluator waiting for its one request (supervisor side)."""

    def __init__(self, handler: Handler, devnull: int, memory_bytes: int, settings: dict[str, Any]) -> None:
        request_read, self.request_fd = os.pipe()
        self.result_fd, result_write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the evaluator: never returns into the supervisor's code
            code = 71
            try:
                _evaluate(handler, devnull, request_read, result_write, memory_bytes, settings)
                code = 0
            finally:
                os._exit(code)
        os.close(request_read)
        os.close(result_write)
        for descriptor in (self.request_fd, self.result_fd):
            os.set_blocking(descriptor, False)
        self.reaped = False

    def alive(self) -> bool:
        if not self.reaped and os.waitpid(self.pid, os.WNOHANG)[0] != 0:
            self.reaped = True
        return not self.reaped

    def run(self, payload: bytes, timeout_s: float) -> dict[str, Any] | None:
        """The reply to ``payload`` as an outcome dict; None if the evaluator was gone before it.
        The evaluator is killed in every case; its exit (unmapping its memory takes milliseconds)
        is reaped later, so the reply does not wait for it."""
        deadline = time.monotonic() + timeout_s
        try:
            _write_all(self.request_fd, payload, deadline)
        except BrokenPipeError:
            self.discard(wait=True)
            return None
        except TimeoutError:
            self.discard(wait=False)
            return {"status": "timeout", "detail": f"request not taken within {timeout_s:g} s"}
        finally:
            os.close(self.request_fd)
        data, end = _read_to_end(self.result_fd, MAX_REPLY_BYTES, deadline)
        if end == "eof" and not data:
            return {"status": "crashed", "detail": _describe(self.discard(wait=True))}
        self.discard(wait=False)
        if end == "timeout":
            return {"status": "timeout", "detail": f"no reply within {timeout_s:g} s; evaluator killed"}
        if end == "overflow":
            return {"status": "refused", "detail": f"reply over {MAX_REPLY_BYTES} bytes; evaluator killed"}
        try:
            reply = json.loads(data)
        except (ValueError, RecursionError):
            return {"status": "refused", "detail": f"reply is not JSON: {data[:100]!r}"}
        if not (isinstance(reply, dict) and reply.get("status") in ("ok", "error") and "value" in reply):
            return {"status": "refused", "detail": f"reply has no status and value: {data[:100]!r}"}
        return {"status": reply["status"], "value": reply["value"], "detail": str(reply.get("detail", ""))}

    def discard(self, wait: bool) -> int | None:
        """Close its reply pipe and kill it; with ``wait``, reap it and return its wait status (None
        if it was reaped before), else leave it to ``_reap_discarded``."""
        os.close(self.result_fd)
        if self.reaped:
            return None
        self.reaped = True  # from here on only this code waits for it, so its pid cannot be reused
        os.kill(self.pid, signal.SIGKILL)
        if not wait:
            _discarded.append(self.pid)
            return None
        return os.waitpid(self.pid, 0)[1]


_discarded: list[int] = []  # killed evaluators not reaped yet (supervisor side)


def _reap_discarded() -> None:
    for pid in list(_discarded):
        if os.waitpid(pid, os.WNOHANG)[0] != 0:
            _discarded.remove(pid)


def _describe(status: int | None) -> str:
    if status is None:
        return "evaluator gone"
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        name = signal.Signals(number).name if number in signal.valid_signals() else f"signal {number}"
        hint = {"SIGXCPU": " (CPU limit)", "SIGKILL": " (killed: CPU limit or the kernel)"}.get(name, "")
        return f"evaluator died of {name}{hint} without a reply"
    return f"evaluator exited with code {os.waitstatus_to_exitcode(status)} without a reply"


def _evaluate(
    handler: Handler,
    devnull: int,
    request_fd: int,
    result_fd: int,
    memory_bytes: int,
    settings: dict[str, Any],
) -> None:
    """The evaluator's life: confine, take the request, score it, reply once."""
    for standard in (0, 1, 2):
        os.dup2(devnull, standard)
    keep = sorted({0, 1, 2, request_fd, result_fd})
    for low, high in zip(keep, [*keep[1:], 1 << 20], strict=True):
        os.closerange(low + 1, high)
    confinement.set_limits(memory_bytes, settings["open_files"])
    confinement.confine_evaluator(drop_to_nobody=settings["drop_to_nobody"])
    _warm_up(handler)
    chunks = []
    while chunk := os.read(request_fd, 1 << 16):  # from the supervisor, which wrote it whole
        chunks.append(chunk)
    os.close(request_fd)
    timeout_s, request = pickle.loads(b"".join(chunks))
    confinement.limit_cpu(math.ceil(timeout_s) + settings["cpu_slack_s"])
    try:
        reply = json.dumps({"status": "ok", "value": handler.score(request)})
    except BaseException as error:  # the scorer's failure, reported, never the supervisor's
        reply = json.dumps({"status": "error", "value": None, "detail": repr(error)[:500]})
    _write_all(result_fd, reply.encode(), None)
    os.close(result_fd)  # the end of the reply now, not after this process's memory is unmapped


def _warm_up(handler: Handler) -> None:
    for request in handler.warm_up:
        with contextlib.suppress(Exception):  # a warm-up only; real requests report their own errors
            handler.score(request)


def _supervise() -> None:
    """The supervisor's program (``python -c``): set up, say ready, serve requests until EOF."""
    replies = os.dup(1)
    os.dup2(2, 1)  # what a library prints goes to stderr, never into the replies
    config = pickle.loads(_read_frame(0, None, None))
    devnull = os.open("/dev/null", os.O_RDWR)
    problems = confinement.enter_namespaces(config["unprivileged"])
    module_name, _, function_name = config["setup"].partition(":")
    handler = getattr(importlib.import_module(module_name), function_name)(config["args"])
    if not isinstance(handler, Handler):
        handler = Handler(handler)
    for _ in range(2):  # the first loads what is lazily loaded, the second is timed
        started = time.monotonic()
        _warm_up(handler)
    if time.monotonic() - started > WARM_UP_LIMIT_S:
        handler = Handler(handler.score)
    expose = {sys.base_prefix, sys.prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    expose.update(path for path in sys.path if path and os.path.exists(path))
    isolation = confinement.seal(sorted(expose), namespaces=not problems, unprivileged=config["unprivileged"])
    isolation = dataclasses.replace(isolation, problems=(*problems, *isolation.problems))
    os.chdir("/")
    settings = {
        "open_files": config["open_files"],
        "cpu_slack_s": config["cpu_slack_s"],
        "drop_to_nobody": isolation.user == "nobody",
    }
    gc.collect()
    gc.freeze()  # evaluators then copy fewer pages: the collector leaves the frozen objects alone
    memory_bytes = confinement.address_space_bytes() + config["memory_bytes"]
    ready = {"ready": True, "pid": os.getpid(), "isolation": isolation.as_dict()}
    _write_frame(replies, json.dumps(ready).encode(), None)
    spare: _Evaluator | None = _Evaluator(handler, devnull, memory_bytes, settings)
    while True:
        try:
            frame = _read_frame(0, None, None)
        except EOFError:
            break
        sequence, timeout_s, request = pickle.loads(frame)
        payload = pickle.dumps((timeout_s, request))
        on_demand = False
        result = None
        for _ in range(2):  # a spare that died while waiting is replaced once
            if spare is None or not spare.alive():
                if spare is not None:
                    spare.discard(wait=True)
                spare = _Evaluator(handler, devnull, memory_bytes, settings)
                on_demand = True
            result = spare.run(payload, timeout_s)
            spare = None
            if result is not None:
                break
        result = result or {"status": "crashed", "detail": "two evaluators gone before their request"}
        reply = json.dumps({**result, "sequence": sequence, "forked_on_demand": on_demand}).encode()
        if len(reply) > _MAX_FRAME_BYTES:  # JSON's escapes can grow a reply that fitted its cap
            refused = {"status": "refused", "detail": "reply too large", "sequence": sequence}
            reply = json.dumps({**refused, "forked_on_demand": on_demand}).encode()
        _write_frame(replies, reply, None)
        _reap_discarded()
        spare = _Evaluator(handler, devnull, memory_bytes, settings)


# --- the caller's side -------------------------------------------------------------------------

_live: weakref.WeakSet[Sandbox] = weakref.WeakSet()
_warned: set[tuple[str, str]] = set()


class Sandbox:
    """A supervisor process that scores requests in confined evaluators (see the module docstring).

    ``call`` is thread-safe (one request at a time) and never raises for anything the scorer or the
    answer does. A supervisor is started on first use (or by ``start``) and again at once, in the
    background, after one fails. A copy (pickle) starts its own.
    """

    def __init__(
        self,
        setup: str,
        args: Any,
        *,
        name: str,
        memory_bytes: int = EVALUATOR_MEMORY_BYTES,
        open_files: int = EVALUATOR_OPEN_FILES,
        start_timeout_s: float = START_TIMEOUT_S,
        unprivileged: bool = False,
    ) -> None:
        self.setup, self.args, self.name = setup, args, name
        self.memory_bytes, self.open_files, self.start_timeout_s = memory_bytes, open_files, start_timeout_s
        self.unprivileged = unprivileged  # behave as a non-root caller (tests of that path, as root)
        self._reset()

    def _reset(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0
        self._lock = threading.Lock()
        self._sequence = 0
        self.isolation: confinement.Isolation | None = None
        self.pid: int | None = None  # the supervisor's, once ready
        self.starts = 0  # supervisors started
        self.start_waits = 0  # calls that waited for a supervisor to come up
        self.on_demand_forks = 0  # requests that found no spare evaluator
        _live.add(self)

    def start(self) -> None:
        """Start a supervisor in the background if none runs (``call`` waits for it to be ready)."""
        if self._process is not None:
            return
        environment = dict(_ENVIRONMENT)
        if "PYTHONHASHSEED" in os.environ:
            environment["PYTHONHASHSEED"] = os.environ["PYTHONHASHSEED"]
        process = subprocess.Popen(
            [sys.executable, "-s", "-P", "-B", "-c", _PROGRAM.format(root=_PACKAGE_ROOT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=environment,
            cwd="/",
        )
        assert process.stdin is not None and process.stdout is not None
        for pipe in (process.stdin, process.stdout):
            os.set_blocking(pipe.fileno(), False)
        self._process, self._started_at, self.pid, self.isolation = process, time.monotonic(), None, None
        self.starts += 1
        config = {
            "setup": self.setup,
            "args": self.args,
            "memory_bytes": self.memory_bytes,
            "open_files": self.open_files,
            "cpu_slack_s": EVALUATOR_CPU_SLACK_S,
            "unprivileged": self.unprivileged,
        }
        deadline = time.monotonic() + self.start_timeout_s
        try:
            _write_frame(process.stdin.fileno(), pickle.dumps(config), deadline)
        except (OSError, TimeoutError) as error:
            self._kill()
            raise SandboxStartError(
                f"sandbox {self.name}: the supervisor did not take its setup ({error!r})"
            ) from error

    def call(self, request: Any, timeout_s: float) -> Outcome:
        """Score ``request`` in a fresh evaluator with ``timeout_s``; an ``Outcome``, never raises."""
        with self._lock:
            try:
                self._ensure_ready()
            except (SandboxStartError, OSError) as error:
                return Outcome("failed", detail=str(error))
            process = self._process
            assert process is not None and process.stdin is not None and process.stdout is not None
            self._sequence += 1
            deadline = time.monotonic() + timeout_s + SUPERVISOR_SLACK_S
            try:
                message = pickle.dumps((self._sequence, timeout_s, request))
                _write_frame(process.stdin.fileno(), message, deadline)
                reply = json.loads(_read_frame(process.stdout.fileno(), deadline, _MAX_FRAME_BYTES))
                if not isinstance(reply, dict) or reply.get("sequence") != self._sequence:
                    raise ValueError(f"a reply out of sequence: {str(reply)[:200]}")
            except (OSError, EOFError, TimeoutError, ValueError) as error:
                code = process.poll()
                self._kill()
                logger.warning(
                    "sandbox %s: supervisor failed (%r, exit %s); starting another", self.name, error, code
                )
                try:
                    self.start()  # in the background: the next call finds it coming up or ready
                except (SandboxStartError, OSError) as start_error:
                    logger.warning("sandbox %s: %s", self.name, start_error)
                return Outcome("failed", detail=f"supervisor failed: {error!r}")
        if reply.get("forked_on_demand"):
            self.on_demand_forks += 1
        status = reply.get("status")
        if status not in ("ok", "error", "timeout", "crashed", "refused"):
            return Outcome("refused", detail=f"unknown status {status!r}")
        return Outcome(status, reply.get("value"), str(reply.get("detail", "")))

    def _ensure_ready(self) -> None:
        if self._process is None:
            self.start()
        if self.pid is not None:
            return
        process = self._process
        assert process is not None and process.stdout is not None
        if not _readable(process.stdout.fileno()):
            self.start_waits += 1  # it is still coming up: this call waits for it
        try:
            deadline = self._started_at + self.start_timeout_s
            ready = json.loads(_read_frame(process.stdout.fileno(), deadline, _MAX_FRAME_BYTES))
            pid, isolation = int(ready["pid"]), ready["isolation"]
            self.isolation = confinement.Isolation(**{**isolation, "problems": tuple(isolation["problems"])})
        except (OSError, EOFError, TimeoutError, ValueError, KeyError, TypeError) as error:
            code = process.poll()
            self._kill()
            raise SandboxStartError(
                f"sandbox {self.name}: the supervisor for {self.setup} did not come up within "
                f"{self.start_timeout_s:g} s ({error!r}, exit {code}); its error is above in stderr"
            ) from error
        self.pid = pid
        for problem in self.isolation.problems:
            if (self.name, problem) not in _warned:
                _warned.add((self.name, problem))
                logger.warning("sandbox %s: %s", self.name, problem)

    def close(self) -> None:
        """Stop the supervisor (its evaluators follow); the next call starts another."""
        with self._lock:
            self._kill()

    def _kill(self) -> None:
        process, self._process, self.pid = self._process, None, None
        if process is None:
            return
        process.kill()
        process.wait()
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()

    def _disown(self) -> None:
        """In a forked child: the supervisor is the parent's; close this copy of its pipes only."""
        process = self._process
        if process is not None:
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()
            process.returncode = 0  # so that Popen's finaliser leaves the parent's process alone
        self._reset()

    def __getstate__(self) -> dict[str, Any]:  # a copy starts its own supervisor
        keys = ("setup", "args", "name", "memory_bytes", "open_files", "start_timeout_s", "unprivileged")
        return {key: getattr(self, key) for key in keys}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()


def _after_fork_in_child() -> None:
    for sandbox in list(_live):
        sandbox._disown()


os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _stop_all() -> None:
    for sandbox in list(_live):
        sandbox._kill()
