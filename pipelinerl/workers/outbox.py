"""An actor's finished rollouts on their way to the preprocessor.

A train group goes whole, all its members one after another once the last has finished: the
preprocessor can do nothing with fewer, and a group none of whose members has gone is whole in the
actor, which a restart of the trainer role can keep (``Actor.pause_for_rebase``). An eval rollout goes
as it finishes. When the rollout queue is full (backpressure from the trainer) the outbox waits, idle,
until there is room, or until it is told to give up (a stop, a rebase): then what was not sent stays,
in order, for the next ``flush``.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator

from pipelinerl.platform.transport import Sender
from pipelinerl.platform.wire import Rollout


class Outbox:
    def __init__(self, open_socket: Callable[[], Sender]) -> None:
        self._open_socket = open_socket
        self._socket = open_socket()
        self._finishing: dict[str, list[Rollout]] = {}  # train groups whose last member is still written
        self._unsent: deque[Rollout] = deque()  # waiting for room in the rollout queue

    def __len__(self) -> int:
        """The rollouts finished and not sent."""
        return len(self._unsent) + sum(len(members) for members in self._finishing.values())

    def put(self, rollout: Rollout) -> None:
        if rollout.split != "train":
            self._unsent.append(rollout)
            return
        members = self._finishing.setdefault(rollout.group_id, [])
        members.append(rollout)
        if len(members) == rollout.group_size:
            self._unsent.extend(self._finishing.pop(rollout.group_id))

    def flush(
        self, give_up: Callable[[], bool], idle: Callable[[], contextlib.AbstractContextManager[None]]
    ) -> bool:
        """Send every whole group and eval rollout, in order, waiting inside ``idle()`` while the queue is
        full; False if ``give_up()`` said so first (the rest stays unsent)."""
        while self._unsent:
            rollout = self._unsent[0]
            if not self._socket.send(rollout, timeout_s=0):
                with idle():
                    while not self._socket.send(rollout, timeout_s=0.2):
                        if give_up():
                            return False
            self._unsent.popleft()
        return True

    def held(self) -> Iterator[Rollout]:
        """Every rollout finished and not sent."""
        yield from self._unsent
        for members in self._finishing.values():
            yield from members

    def keep_only(self, groups: set[str]) -> None:
        """Forget every rollout not of ``groups``."""
        self._unsent = deque(rollout for rollout in self._unsent if rollout.group_id in groups)
        self._finishing = {group: members for group, members in self._finishing.items() if group in groups}

    def reopen(self) -> None:
        """A new socket: what waited in the old one (for a preprocessor that died) is dropped with it."""
        self._socket.close()
        self._socket = self._open_socket()

    def close(self) -> None:
        self._socket.close()
