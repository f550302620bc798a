"""The actor's stop flag, which also wakes every thread waiting on the actor's weights condition."""

from __future__ import annotations

import threading


class StopFlag:
    """The actor's stop flag: setting it also wakes every thread waiting on ``condition``.

    The main thread of a conventional run waits on the weights condition for the next round's
    weights; a stop that only set a flag would leave it asleep until the launcher killed the process
    after its grace period. Tying the two here wakes it whoever stops the actor, and however."""

    def __init__(self, condition: threading.Condition) -> None:
        self._event = threading.Event()
        self._condition = condition

    def set(self) -> None:
        with self._condition:
            self._event.set()
            self._condition.notify_all()

    def is_set(self) -> bool:
        return self._event.is_set()
