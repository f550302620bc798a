"""Stage processes forked from a server that has imported their libraries once.

Every stage of a run (the trainer ranks, the preprocessor, a transformers actor) starts as ``python -m
pipelinerl.workers.<stage>`` and spends its first seconds importing torch, transformers, DeepSpeed and
the platform: about 10 s of CPU a run on this project's 2-core machines, paid again by every stage of
every run and every restart (docs/benchmarks.md, "Test suite"). Here a **stage server** (this module
run as ``python -m pipelinerl.launch.stage_server``) imports a stage's module the first time it is
asked for one (the trainer's with DeepSpeed), and forks that stage and every later one from that
state, as a zygote does: the stage runs its module's ``main(argv)`` with its own environment, working
directory, cores, umask, log file and process group, and shows its usual command line in ``ps``.

The server is single-threaded and only imports (no torch work: OpenMP's threads do not survive a
fork), and it serves only stages on machines without GPUs (CUDA must start in the process that uses it;
``launch/stages.py`` decides). What a library reads from the environment when it is imported is frozen
in the server, so a server serves only stages whose environment, less each stage's own variables
(``PER_STAGE``), is the one it was started with; another environment gets another server.

Protocol, one JSON object a line: the launcher writes a request (``module``, ``argv``, ``command``,
``env``, ``cwd``, ``log``, ``cpus``, ``umask``) and reads ``{"started": pid}`` back; the server also
writes ``{"exited": pid, "code": n}`` when a stage ends (``n`` as ``Popen.returncode``: negative for a
signal). The server ends when its input closes (the launcher's process ended); its stages, which get
``PR_SET_PDEATHSIG``, end with it, as they would with the launcher.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import io
import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TRAINER = "pipelinerl.workers.trainer"  # its DeepSpeed is imported with it (at run time otherwise)
# A stage's own variables, read when it runs (never at import): servers are shared across them.
PER_STAGE = frozenset(
    {
        "OMP_NUM_THREADS",  # each stage sets torch's threads itself (torch.set_num_threads)
        "MKL_NUM_THREADS",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_NAME",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "PYTEST_CURRENT_TEST",  # the test runner's, new for every test
    }
)
# Room the server's command line and environment keep for a stage's (``ps`` and /proc/PID/environ show
# what the stage would have been started with).
TITLE_ROOM = 4096
ENVIRONMENT_ROOM = 1 << 16
ROOM_VARIABLE = "PIPELINERL_STAGE_SERVER_ROOM"
START_TIMEOUT_S = 120.0  # the server's imports on a loaded machine
PR_SET_PDEATHSIG = 1


# ----- the server (this module run as a program) -----------------------------------------------------


def die_with_parent() -> None:
    """In a new process, before it runs anything: SIGTERM when its parent dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _load(module: str) -> None:
    """Import a stage's module in the server the first time a stage of it is asked for: it and every
    later stage of it fork from that state, and a server never imports what its launcher's stages do
    not run (a node of the actors' pool loads no DeepSpeed). A failure is left to the stage, whose own
    import then fails in its log, as a new interpreter's would."""
    if module in sys.modules:
        return
    try:
        importlib.import_module(module)
        if module == TRAINER:
            from pipelinerl.workers.deepspeed_import import import_deepspeed  # noqa: PLC0415 (with the trainer only)

            import_deepspeed()
    except Exception as error:  # the stage imports it again and fails where its log shows it
        log.warning("stage server: importing %s failed (%s); the stage imports it itself", module, error)


_PROTOCOL_FD = 1  # the launcher's pipe; main() moves it off stdout, where a library may print


def _reply(message: dict[str, Any]) -> None:
    os.write(_PROTOCOL_FD, (json.dumps(message) + "\n").encode())


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _reply({"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def serve() -> dict[str, Any] | None:
    """Answer requests until the input closes (None); in a forked stage, its request."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    pending = b""
    while True:
        ready, _, _ = select.select([0, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap()
        if 0 not in ready:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            return None
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            _load(request["module"])
            settled_r, settled_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the stage: leave the server's loop with its request
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (wake_r, wake_w, settled_r, _PROTOCOL_FD):
                    os.close(fd)
                _settle(request)
                os.close(settled_w)  # its own group and command line now: the launcher may see it
                return dict(request)
            os.close(settled_w)
            os.read(settled_r, 1)  # until the stage has settled (or died trying)
            os.close(settled_r)
            _reply({"started": pid})


def _show(parts: Sequence[str], field: int) -> None:
    """Write ``parts`` over this process's argument (``field`` 48) or environment (50) area, as the kernel
    shows them (/proc/PID/cmdline and environ, ``ps``, psutil): NUL-separated, the rest of the area NULs.
    Left as is if they do not fit."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        # /proc/self/stat's fields (arg_start, arg_end, env_start, env_end: 48-51), after the name's ")"
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[field - 3]), int(fields[field - 2])
        text = b"\0".join(part.encode() for part in parts) + b"\0"
        if len(text) <= end - start:
            ctypes.memmove(start, text.ljust(end - start, b"\0"), end - start)


def _settle(request: Mapping[str, Any]) -> None:
    """In the forked stage, before the launcher hears of it: its own session (process group) and its
    command line, so that the launcher's signals and anyone's ``ps`` find it as a stage."""
    os.setsid()
    die_with_parent()
    _show(request["command"], 48)
    _show([f"{key}={value}" for key, value in request["env"].items()], 50)


def run_stage(request: Mapping[str, Any]) -> None:
    """In the forked stage: its cores, umask, directory, environment and log, then its main."""
    if request["cpus"]:
        os.sched_setaffinity(0, request["cpus"])
    os.umask(request["umask"])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    # The log takes file descriptors 1 and 2, under the streams (and the handlers libraries made of
    # them at import), unbuffered as PYTHONUNBUFFERED makes a stage's.
    log_fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True, write_through=True)
    module = importlib.import_module(request["module"])
    sys.argv = [module.__file__ or request["module"], *request["argv"]]
    module.main(list(request["argv"]))


def main() -> None:
    global _PROTOCOL_FD
    _PROTOCOL_FD = os.dup(1)
    os.dup2(2, 1)  # what the imports print goes where the server's errors go
    _reply({"ready": os.getpid()})
    request = serve()
    if request is None:
        return
    run_stage(request)  # returns, raises or exits as `python -m` would: the interpreter ends the stage


# ----- the launcher's side ----------------------------------------------------------------------------


class ForkedProcess:
    """A stage forked by a server, with the part of ``subprocess.Popen`` the launcher uses."""

    def __init__(self, pid: int, server: StageServer, command: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(command)
        self._server = server

    @property
    def returncode(self) -> int | None:
        return self._server.exit_code(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self._server.wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code


def server_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of a stage's environment its server must have been started with."""
    return {key: value for key, value in env.items() if key not in PER_STAGE}


class StageServer:
    """One server process: started with an environment, forks stages on request."""

    def __init__(self, python: str, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self._lock = threading.Lock()
        self._changed = threading.Condition()
        self._exits: dict[int, int] = {}
        self._started: list[int] = []
        self._mine: set[int] = set()
        self._ended = False
        # What the server's imports print (DeepSpeed's accelerator notice, ...) is no run's: kept here
        # for the error of a server that did not start, not shown in the launcher's output.
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed with the server)
        self.process = subprocess.Popen(
            [python, "-m", "pipelinerl.launch.stage_server", " " * TITLE_ROOM],
            env={**self.env, ROOM_VARIABLE: " " * ENVIRONMENT_ROOM},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            start_new_session=True,  # a Ctrl-C for the launcher is the launcher's to handle
        )
        self._reader = threading.Thread(target=self._read, name="stage-server", daemon=True)
        self._reader.start()
        with self._changed:
            started = self._changed.wait_for(lambda: self._started or self._ended, START_TIMEOUT_S)
        if not started or self._ended:
            why = f"did not start in {START_TIMEOUT_S:.0f} s" if not started else "exited"
            tail = self.error_tail()
            self.close()
            raise RuntimeError(f"the stage server {why}; its last lines:\n{tail}")
        with self._changed:
            self._started.clear()  # the server's own "ready"

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                log.warning("stage server: unreadable message %r", line[:200])
                continue
            with self._changed:
                if "exited" in message:
                    self._exits[int(message["exited"])] = int(message["code"])
                else:
                    self._started.append(int(message.get("started", message.get("ready", -1))))
                self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    @property
    def alive(self) -> bool:
        return not self._ended and self.process.poll() is None

    @property
    def serving(self) -> bool:
        """Whether a stage it forked is still running."""
        with self._changed:
            return any(pid not in self._exits for pid in self._mine)

    def spawn(
        self,
        module: str,
        argv: Sequence[str],
        command: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        log_path: Path,
        cpus: Sequence[int],
        umask: int,
    ) -> ForkedProcess:
        request = {
            "module": module,
            "argv": list(argv),
            "command": list(command),
            "env": dict(env),
            "cwd": str(cwd),
            "log": str(log_path),
            "cpus": list(cpus),
            "umask": umask,
        }
        with self._lock:
            assert self.process.stdin is not None
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
            with self._changed:
                if not self._changed.wait_for(lambda: self._started or self._ended, START_TIMEOUT_S):
                    raise RuntimeError(f"the stage server did not fork {module} in {START_TIMEOUT_S:.0f} s")
                if not self._started:
                    raise RuntimeError("the stage server exited")
                pid = self._started.pop(0)
                self._mine.add(pid)
        return ForkedProcess(pid, self, command)

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            if pid in self._exits:
                return self._exits[pid]
            if self._ended:  # the server is gone: its stages got SIGTERM (PR_SET_PDEATHSIG)
                return None if _running(pid) else -signal.SIGTERM
            return None

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or self._ended, timeout)
        return self.exit_code(pid)

    def error_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError, ValueError):
            self._errors.seek(0)
            return "\n".join(self._errors.read().decode(errors="replace").splitlines()[-lines:])
        return "(no output)"

    def close(self) -> None:
        """End the server (its input closes); stages still running get SIGTERM with it."""
        with contextlib.suppress(OSError, ValueError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(OSError):
            self._errors.close()


def _running(pid: int) -> bool:
    import psutil  # noqa: PLC0415 (only on the rare path of a server that died)

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


_SERVERS: dict[tuple[str, tuple[tuple[str, str], ...]], StageServer] = {}
_SERVERS_LOCK = threading.Lock()


def server_for(python: str, env: Mapping[str, str]) -> StageServer:
    """This process's server for stages of ``python`` with environment ``env`` (started once; again
    if it has died)."""
    shared = server_env(env)
    key = (python, tuple(sorted(shared.items())))
    with _SERVERS_LOCK:
        server = _SERVERS.get(key)
        if server is None or not server.alive:
            # A server for another environment that runs no stage now is not kept beside a new one.
            for other_key, other in list(_SERVERS.items()):
                if other_key != key and not other.serving:
                    other.close()
                    del _SERVERS[other_key]
            server = _SERVERS[key] = StageServer(python, shared)
        return server


def close_servers() -> None:
    with _SERVERS_LOCK:
        for server in _SERVERS.values():
            server.close()
        _SERVERS.clear()


if __name__ == "__main__":
    main()
