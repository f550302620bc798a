"""A restart of the trainer role, between an actor's two threads (``platform/rebase.py``).

The weights thread sees the launcher's notice (``new``) and asks the main thread to pause (``ask``,
which waits for the answer); the main thread keeps what is valid, aborts the rest, answers the
launcher and says so (``answered``); the weights thread joins the restarted trainer's weight group and
takes its first update, the resumed lineage's weights, which ends the pause (``loaded``). Until then
the main thread admits nothing (``resumed`` is false).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from pipelinerl.platform.rebase import Rebase, read_rebase


class RebaseHandshake:
    def __init__(self, run_dir: Path, enabled: bool) -> None:
        self._run_dir = run_dir
        self._enabled = enabled  # run.actors_survive_restart
        current = read_rebase(run_dir) if enabled else None
        self._attempt = current.attempt if current is not None else 0  # a notice older than the process
        self.request: Rebase | None = None  # what the main thread is to pause for
        self.version: int | None = None  # the version whose weights end the pause
        self._answered = threading.Event()
        self._loaded = threading.Event()

    def new(self) -> Rebase | None:
        """The launcher's notice of a restart this actor has not handled yet, if any."""
        if not self._enabled:
            return None
        rebase = read_rebase(self._run_dir)
        return rebase if rebase is not None and rebase.attempt > self._attempt else None

    def ask(self, rebase: Rebase, stopped: Callable[[], bool]) -> bool:
        """The weights thread: have the main thread pause for ``rebase``; True once it answered, False
        if the actor stopped first."""
        self._attempt, self.version = rebase.attempt, rebase.version
        self._answered.clear()
        self._loaded.clear()
        self.request = rebase
        while not self._answered.wait(0.2):
            if stopped():
                return False
        return True

    def answered(self) -> None:
        """The main thread: paused and answered the launcher; it waits for ``resumed``."""
        self.request = None
        self._answered.set()

    def ends_pause(self, version: int) -> bool:
        """``version`` is the resumed lineage's first: loaded though older than the engine's."""
        return version == self.version

    def loaded(self, version: int) -> None:
        if version == self.version:
            self.version = None
            self._loaded.set()

    def resumed(self) -> bool:
        return self._loaded.is_set()
