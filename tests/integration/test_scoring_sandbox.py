"""The scoring sandbox on its own, with real processes and a scorer that evaluates whatever it is
given (the worst scorer there could be): code in an evaluator writes no file, reaches no socket,
starts no program and signals no process; forged, oversized, partial or missing replies decide
nothing beyond their own request; every wait ends at its deadline; a supervisor that dies is
replaced in the background; a timed-out request costs no supervisor start."""

from __future__ import annotations

import os
import pickle
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipelinerl.tasks.sandbox import MAX_REPLY_BYTES, Handler, Outcome, Sandbox
from tests.side_effects import connections

# The supervisor imports it from the repository root (pytest may know this module by its base name).
SETUP = "tests.integration.test_scoring_sandbox:evaluating_scorer"
ROOT = os.geteuid() == 0


def evaluating_scorer(args: Any) -> Handler:
    """The sandbox's setup for these tests: ``eval`` of the request, the unsafe scorer in its purest form."""

    def score(request: str) -> Any:
        return eval(request)  # noqa: S307 - deliberately: what the sandbox must contain

    return Handler(score, ("1 + 1",))


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    sandbox = Sandbox(SETUP, None, name="test")
    yield sandbox
    sandbox.close()


def _run(code: str) -> str:
    """A statement block as an expression for the evaluating scorer (exec inside its eval)."""
    return f"exec({code!r}) or 'done'"


def test_requests_are_scored_in_order(sandbox: Sandbox) -> None:
    assert [sandbox.call(f"{n} * 2", 5.0) for n in range(3)] == [Outcome("ok", 2 * n) for n in range(3)]
    assert sandbox.call("1 / 0", 5.0) == Outcome("error", None, "ZeroDivisionError('division by zero')")


@pytest.mark.skipif(not ROOT, reason="the full isolation needs root")
def test_evaluators_run_as_nobody_without_network_or_writable_files(sandbox: Sandbox) -> None:
    sandbox.call("0", 5.0)
    assert sandbox.isolation is not None and sandbox.isolation.complete, sandbox.isolation
    assert sandbox.call("__import__('os').getresuid()", 5.0).value == [65534] * 3
    assert sandbox.call("__import__('os').getgroups()", 5.0).value == []
    assert sandbox.call("__import__('os').getcwd()", 5.0).value == "/"


def test_the_environment_is_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINERL_TEST_SECRET", "do-not-leak")
    sandbox = Sandbox(SETUP, None, name="test-environment")
    try:
        environment = sandbox.call("dict(__import__('os').environ)", 5.0).value
    finally:
        sandbox.close()
    assert "PIPELINERL_TEST_SECRET" not in environment
    allowed = {"PATH", "LANG", "LC_CTYPE", "PYTHONHASHSEED"}
    assert set(environment) - allowed == {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"}


def test_code_cannot_write_connect_run_programs_or_signal(
    sandbox: Sandbox, drop: Path, listener: socket.socket
) -> None:
    port = listener.getsockname()[1]
    sandbox.call("0", 5.0)
    assert sandbox.isolation is not None
    if not (sandbox.isolation.network and sandbox.isolation.filesystem):
        pytest.skip(f"this machine allows no namespaces: {sandbox.isolation.problems}")
    attempts = {
        "file": f"open('{drop}/written', 'w').write('x')",
        "directory": f"__import__('os').mkdir('{drop}/made')",
        "shell": f"__import__('os').system('touch {drop}/touched')",
        "program": "__import__('subprocess').run(['true'])",
        "fork": "__import__('os').fork()",
        "tcp": f"__import__('socket').create_connection(('127.0.0.1', {port}), timeout=2)",
        "signal": f"__import__('os').kill({os.getpid()}, {signal.SIGTERM.value})",
        "root": "__import__('os').setuid(0)",
    }
    outcomes = {name: sandbox.call(code, 5.0) for name, code in attempts.items()}
    assert list(drop.iterdir()) == []
    assert connections(listener) == 0
    failed = {name for name, outcome in outcomes.items() if outcome.status == "error"}
    # os.system reports the shell it could not start as exit status 127 instead of raising.
    assert failed == set(attempts) - {"shell"} and outcomes["shell"] == Outcome("ok", 127 << 8)
    if ROOT:
        assert "Read-only file system" in outcomes["file"].detail  # not merely a permission


def test_a_forged_reply_decides_only_its_own_request(sandbox: Sandbox) -> None:
    # Bytes shaped like the supervisor's replies and the evaluator's, to every descriptor there is.
    forged = b'\x00\x00\x00\x2c{"sequence": 99, "status": "ok", "value": 1.0}{"status": "ok", "value": 1.0}\n'
    forge = _run(
        "import os\n"
        "for fd in range(1024):\n"
        "    try:\n"
        f"        os.write(fd, {forged!r})\n"
        "    except OSError:\n"
        "        pass\n"
    )
    for _ in range(3):
        sandbox.call(forge, 5.0)  # its own outcome is whatever it wrote: it ran code
        assert sandbox.call("'next'", 5.0) == Outcome("ok", "next")
        assert sandbox.call("6 * 7", 5.0) == Outcome("ok", 42)


def test_a_partial_reply_then_a_sleep_ends_at_the_deadline(sandbox: Sandbox) -> None:
    stall = _run(
        "import os, time\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        '        os.write(fd, b\'{"status": "ok"\')\n'
        "    except OSError:\n"
        "        pass\n"
        "time.sleep(600)\n"
    )
    supervisor, waits = sandbox.pid, sandbox.start_waits
    outcome = sandbox.call(stall, 1.0)
    assert outcome.status == "timeout" and "evaluator killed" in outcome.detail
    assert sandbox.call("__import__('time').sleep(600)", 1.0).status == "timeout"
    assert sandbox.call("sum(range(10 ** 12))", 1.0).status == "timeout"
    # Only the evaluators were killed: the same supervisor answers at once, nobody waited for a start.
    assert sandbox.call("'after'", 5.0) == Outcome("ok", "after")
    assert (sandbox.pid, sandbox.start_waits) == (supervisor, waits)


def _reply_and_exit(data: bytes) -> str:
    """Code that writes ``data`` on the evaluator's own reply pipe (its one pipe) and exits."""
    return _run(
        "import os, stat\n"
        "for name in os.listdir('/proc/self/fd'):\n"
        "    try:\n"
        "        if stat.S_ISFIFO(os.fstat(int(name)).st_mode):\n"
        f"            os.write(int(name), {data!r})\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(0)\n"
    )


def test_oversized_malformed_or_missing_replies_are_refused(sandbox: Sandbox) -> None:
    big = sandbox.call(_reply_and_exit(b"x" * (MAX_REPLY_BYTES + 10)), 5.0)
    assert big.status == "refused" and str(MAX_REPLY_BYTES) in big.detail
    assert sandbox.call(_reply_and_exit(b"not json"), 5.0).status == "refused"
    assert sandbox.call(_reply_and_exit(b'{"value": 1}'), 5.0).status == "refused"
    # Its own reply is all an evaluator can decide: this one's, by running code.
    assert sandbox.call(_reply_and_exit(b'{"status": "ok", "value": 1.0}'), 5.0) == Outcome("ok", 1.0)
    exited = sandbox.call("__import__('os')._exit(3)", 5.0)
    assert exited == Outcome("crashed", None, "evaluator exited with code 3 without a reply")
    crashed = sandbox.call("__import__('ctypes').string_at(0)", 5.0)
    assert crashed.status == "crashed" and "SIGSEGV" in crashed.detail
    assert sandbox.call("[0] * 10 ** 10", 5.0) == Outcome("error", None, "MemoryError()")
    assert sandbox.call("'still fine'", 5.0) == Outcome("ok", "still fine")


def test_a_killed_supervisor_is_replaced_in_the_background() -> None:
    sandbox = Sandbox(SETUP, None, name="test-replaced")
    try:
        assert sandbox.call("1", 5.0) == Outcome("ok", 1)
        first = sandbox.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        assert sandbox.call("2", 5.0).status == "failed"
        assert sandbox.starts == 2  # the replacement was started by the failed call itself
        assert sandbox.call("3", 5.0) == Outcome("ok", 3)
        assert sandbox.pid not in (None, first)
    finally:
        sandbox.close()


def test_a_copy_starts_its_own_supervisor(sandbox: Sandbox) -> None:
    sandbox.call("0", 5.0)
    copy = pickle.loads(pickle.dumps(sandbox))
    try:
        assert copy.call("'copy'", 5.0) == Outcome("ok", "copy")
        assert copy.pid not in (None, sandbox.pid)
    finally:
        copy.close()


def test_a_setup_that_fails_is_reported_not_raised() -> None:
    sandbox = Sandbox("pipelinerl.tasks.sandbox:no_such_setup", None, name="test-broken", start_timeout_s=60)
    try:
        outcome = sandbox.call("1", 5.0)
    finally:
        sandbox.close()
    assert outcome.status == "failed" and "did not come up" in outcome.detail


@pytest.mark.skipif(not ROOT, reason="runs the non-root path's namespaces as root")
def test_the_unprivileged_path_still_has_no_network_or_writable_files(
    drop: Path, listener: socket.socket
) -> None:
    sandbox = Sandbox(SETUP, None, name="test-unprivileged", unprivileged=True)
    try:
        port = listener.getsockname()[1]
        write = sandbox.call(f"open('{drop}/written', 'w').write('x')", 5.0)
        connect = sandbox.call(f"__import__('socket').create_connection(('127.0.0.1', {port}))", 5.0)
        isolation = sandbox.isolation
    finally:
        sandbox.close()
    assert isolation is not None and isolation.user == "unchanged"
    assert isolation.network and isolation.filesystem and not isolation.complete
    assert write.status == connect.status == "error"
    assert list(drop.iterdir()) == [] and connections(listener) == 0
