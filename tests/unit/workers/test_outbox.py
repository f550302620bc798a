"""The actor's outbox (``workers/outbox.py``) over real ZeroMQ sockets on loopback: a train group goes
whole once its last member finished, an eval rollout at once, in order; with nobody to take them
(a full queue) it gives up when told to and keeps everything for the next flush or a rebase."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import zmq

from pipelinerl.platform.transport import Receiver, Sender
from pipelinerl.platform.wire import Rollout
from pipelinerl.workers.outbox import Outbox
from tests.unit.platform.test_wire import make_rollout

ANY_PORT = "tcp://127.0.0.1:*"


def rollout(group: str, index: int, split: str = "train", size: int = 2) -> Rollout:
    return make_rollout(rollout_id=f"{group}-{index}", group_id=group, group_size=size, split=split)


@contextlib.contextmanager
def never_idle() -> Iterator[None]:
    yield


def received(receiver: Receiver) -> list[str]:
    ids = []
    while (message := receiver.recv(timeout_s=0.5)) is not None:
        assert isinstance(message, Rollout)
        ids.append(message.rollout_id)
    return ids


def test_a_train_group_goes_whole_once_its_last_member_finished_and_eval_at_once() -> None:
    context = zmq.Context()
    with Receiver(context, ANY_PORT, "pull", bind=True) as receiver:
        outbox = Outbox(lambda: Sender(context, receiver.address, "push", bind=False))
        outbox.put(rollout("a", 0))
        outbox.put(rollout("b", 0))
        outbox.put(rollout("eval-0", 0, split="eval", size=10))
        assert outbox.flush(lambda: False, never_idle)
        assert received(receiver) == ["eval-0-0"] and len(outbox) == 2
        outbox.put(rollout("b", 1))
        outbox.put(rollout("a", 1))
        assert outbox.flush(lambda: False, never_idle)
        assert received(receiver) == ["b-0", "b-1", "a-0", "a-1"] and len(outbox) == 0
        outbox.close()
    context.term()


def test_with_nobody_to_take_them_it_gives_up_when_told_and_a_rebase_keeps_the_whole_groups() -> None:
    context = zmq.Context()
    # A push socket that no peer ever took: every send finds the queue full.
    address = ["tcp://127.0.0.1:9"]
    outbox = Outbox(lambda: Sender(context, address[0], "push", bind=False))
    for group in ("a", "b"):
        outbox.put(rollout(group, 0))
        outbox.put(rollout(group, 1))
    outbox.put(rollout("c", 0))
    asked = []
    assert not outbox.flush(lambda: asked.append(1) or len(asked) > 2, never_idle)
    assert len(outbox) == 5 and {r.rollout_id for r in outbox.held()} == {"a-0", "a-1", "b-0", "b-1", "c-0"}
    outbox.keep_only({"b", "c"})
    assert sorted(r.rollout_id for r in outbox.held()) == ["b-0", "b-1", "c-0"]
    with Receiver(context, ANY_PORT, "pull", bind=True) as receiver:
        address[0] = receiver.address
        outbox.reopen()  # the new preprocessor's socket
        outbox.put(rollout("c", 1))
        assert outbox.flush(lambda: False, never_idle)
        assert received(receiver) == ["b-0", "b-1", "c-0", "c-1"]
    outbox.close()
    context.term()
