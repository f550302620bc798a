"""Reliability against damaged input, for each kind of receiving socket and for a live run (issue 15,
wire part).

Socket-level tests drive the platform's ``Receiver`` over real ZeroMQ with a stranger's frames. A live
run under a flood of damaged and impossible input is ``pipelinerl bench faults``'s flooded run
(``test_bench_faults.py``: one property per test, read from what its stages wrote, never from timings).
A conventional run's actor stopping on shutdown while it waits for weights (issue 15 too) is checked on
the hammered run of ``test_stray_peers.py``.
"""

from __future__ import annotations

import itertools
import re
import socket
from collections import Counter
from collections.abc import Iterator

import psutil
import pytest
import zmq

from pipelinerl.bench.fault_frames import (
    damaged_frames,
    numbered,
    stranger_rollout,
)
from pipelinerl.platform.transport import MessageTooLarge, Receiver, Sender
from pipelinerl.platform.wire import (
    Rollout,
    Shutdown,
)
from tests.conftest import wait_until, worker_port

# The line an actor logs as its last when ``Actor.run`` returns; a stage the launcher had to
# SIGTERM or SIGKILL after its grace period never writes it.
ACTOR_CLOSING_LINE = re.compile(r"actor 0: \d+ tokens, \d+ updates")


# ----- damaged frames -------------------------------------------------------------------------------

FRAMES_PER_SOCKET = 10_000


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def refused(message: object) -> bool:
    """What a stage refuses besides what ``decode`` does: not a rollout of this run."""
    return not isinstance(message, Rollout) or message.run_id != "run"


@pytest.mark.parametrize("kind", ["pull-bound", "pull-connecting", "sub-connecting"])
def test_each_kind_of_receiving_socket_survives_ten_thousand_damaged_frames(context, kind) -> None:
    """The preprocessor's rollout PULL binds; the trainer's batch PULL and every SUB connect. A raw
    peer of the right socket type sends 10,000 damaged frames with good rollouts among them: every
    damaged one is counted (malformed, or refused by the stage's own check) and every good one arrives."""
    port = worker_port(27690 + ["pull-bound", "pull-connecting", "sub-connecting"].index(kind))
    address = f"tcp://127.0.0.1:{port}"
    socket_kind = "sub" if kind.startswith("sub") else "pull"
    peer = context.socket(zmq.PUB if socket_kind == "sub" else zmq.PUSH)
    peer.setsockopt(zmq.SNDHWM, 0)
    peer.setsockopt(zmq.LINGER, 0)
    receiver_binds = kind == "pull-bound"
    if not receiver_binds:
        peer.bind(address)
    receiver = Receiver(context, address, socket_kind, bind=receiver_binds, high_water_mark=100_000)
    if receiver_binds:
        peer.connect(address)
    try:
        good = [stranger_rollout(i, run_id="run") for i in range(100)]
        if socket_kind == "sub":  # the slow joiner: wait until a message gets through
            hellos = itertools.count(1)

            def joined() -> bool:
                peer.send_multipart(numbered(Shutdown(reason="hello"), next(hellos), "hello"))
                return receiver.recv(timeout_s=0.1) is not None

            wait_until(joined, 30, "the subscriber to join", interval_s=0)
            while receiver.recv(timeout_s=0.2) is not None:  # the other hellos
                pass
        sent = Counter()
        for index, (damage, frames) in enumerate(damaged_frames(FRAMES_PER_SOCKET, seed=port)):
            peer.send_multipart(frames)
            sent[damage] += 1
            if index % 100 == 0:
                peer.send_multipart(numbered(good[index // 100], index // 100 + 1, "good"))
        received, other = [], 0
        while (message := receiver.recv(timeout_s=2.0)) is not None:
            if refused(message):
                other += 1
            else:
                received.append(message)
        assert [m.rollout_id for m in received] == [m.rollout_id for m in good]
        # Refused: by decode (malformed), as a replayed number (a damaged envelope), or by the stage.
        counts = (receiver.malformed_count, receiver.rejected_count, other, sent)
        assert receiver.malformed_count + receiver.rejected_count + other == FRAMES_PER_SOCKET, counts
        assert receiver.malformed_count > FRAMES_PER_SOCKET // 2
    finally:
        receiver.close()
        peer.close(linger=0)


def test_an_oversized_part_is_refused_by_zeromq_and_counted_as_a_dropped_connection(context) -> None:
    receiver = Receiver(context, "tcp://127.0.0.1:*", "pull", bind=True, max_message_bytes=2**20)
    peer = context.socket(zmq.PUSH)
    peer.setsockopt(zmq.LINGER, 0)
    peer.connect(receiver.address)
    try:
        peer.send_multipart([b"x" * (2**20 + 1)])
        assert receiver.recv(timeout_s=1.0) is None
        # Counted from the socket's monitor, read on a thread of its own.
        wait_until(lambda: receiver.peer_disconnects, 30, "the oversized peer's connection dropped")
        assert receiver.peer_disconnects == 1
        # ZeroMQ reconnects the peer: its next, good message arrives
        peer.send_multipart(numbered(Shutdown(reason="after"), 1))
        assert receiver.recv(timeout_s=10) == Shutdown(reason="after")
    finally:
        receiver.close()
        peer.close(linger=0)


def zmtp_push_announcing(size: int) -> bytes:
    """A ZMTP 3.0 NULL handshake as a PUSH, then the start of one message part announcing ``size`` bytes."""
    greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" * 32
    ready = b"\x05READY" + b"\x0bSocket-Type" + (4).to_bytes(4, "big") + b"PUSH"
    return greeting + b"\x04" + bytes([len(ready)]) + ready + b"\x02" + size.to_bytes(8, "big") + b"x" * 4096


def test_a_part_announcing_a_gibibyte_is_refused_before_it_is_allocated(context) -> None:
    receiver = Receiver(context, "tcp://127.0.0.1:*", "pull", bind=True, max_message_bytes=2**20)
    host, port = receiver.address.removeprefix("tcp://").rsplit(":", 1)
    rss_before = psutil.Process().memory_info().rss
    try:
        for _ in range(20):
            with socket.create_connection((host, int(port)), timeout=10) as raw:
                raw.sendall(zmtp_push_announcing(2**30))
                raw.settimeout(10)
                while raw.recv(4096):  # ZeroMQ answers its greeting, then closes the connection
                    pass
        assert receiver.recv(timeout_s=0.5) is None
        assert receiver.peer_disconnects == 20
        assert psutil.Process().memory_info().rss - rss_before < 200 * 2**20, "20 GiB were announced"
    finally:
        receiver.close()


def test_a_sender_refuses_a_part_no_receiver_would_take(context) -> None:
    sender = Sender(context, "tcp://127.0.0.1:*", "push", bind=True, max_message_bytes=1024)
    try:
        with pytest.raises(MessageTooLarge, match="transport.max_message_mib"):
            sender.send(Shutdown(reason="x" * 2000), timeout_s=0)
        assert sender.sent_count == 0
    finally:
        sender.close()
