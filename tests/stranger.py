"""A stranger's ZeroMQ socket for tests: connects to a run's port, learns how its handshake ended,
and sends without ever blocking.

A PUSH whose peer refuses its handshake (no CurveZMQ keys, or a socket type the port does not pair
with) never gets a ready peer, so a send without a timeout blocks forever. ``send_as_stranger`` waits
for the handshake's outcome on the socket's monitor (an event, not a sleep) and sends with a send
timeout, so the test knows what happened and cannot hang. Every run authenticates its peers, so a
stranger is refused; given the run's keys (``keys``) it plays an insider whose keys leaked.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import zmq
from zmq.utils.monitor import recv_monitor_message

from pipelinerl.platform.curve_keys import CurveKeys, present_client_keys

Handshake = Literal["accepted", "refused"]

_SUCCEEDED = zmq.EVENT_HANDSHAKE_SUCCEEDED
_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_DISCONNECTED
)


@dataclass
class Delivery:
    """What a stranger's sends came to: its handshake, frames handed to ZeroMQ, sends refused."""

    handshake: Handshake
    sent: int
    refused: int


def send_as_stranger(
    address: str,
    messages: list[list[bytes]],
    *,
    handshake_timeout_s: float = 30.0,
    send_timeout_s: float = 1.0,
    keys: CurveKeys | None = None,
) -> Delivery:
    """Connect a PUSH to ``address`` (keyless, or presenting ``keys``), wait for its handshake to
    succeed or fail, then send.

    Raises ``TimeoutError`` naming the address if the handshake has no outcome in time.
    """
    context = zmq.Context.instance()
    socket = context.socket(zmq.PUSH)
    if keys is not None:
        present_client_keys(socket, keys)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDTIMEO, int(send_timeout_s * 1000))
    monitor = socket.get_monitor_socket(_SUCCEEDED | _FAILED)
    try:
        socket.connect(address)
        handshake = _handshake_outcome(monitor, address, handshake_timeout_s)
        sent = refused = 0
        for frames in messages:
            try:
                socket.send_multipart(frames)
                sent += 1
            except zmq.Again:
                refused += 1
        # An accepted peer gets every queued frame before close returns (bounded by the linger).
        socket.setsockopt(zmq.LINGER, 10_000 if handshake == "accepted" else 0)
        return Delivery(handshake, sent, refused)
    finally:
        socket.disable_monitor()
        monitor.close(linger=0)
        socket.close()


def _handshake_outcome(monitor: zmq.Socket, address: str, timeout_s: float) -> Handshake:
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if not monitor.poll(int(left * 1000)):
            break
        event = recv_monitor_message(monitor)["event"]
        if event == _SUCCEEDED:
            return "accepted"
        if event & _FAILED:
            return "refused"
    raise TimeoutError(f"no handshake outcome with {address} within {timeout_s:.0f} s")


GARBAGE = [[b"\xc1garbage", str(index).encode()] for index in range(5)] + [[b"not msgpack at all"]]


@dataclass
class Reception:
    """What a stranger's receiving socket came to: its handshake and the messages it got."""

    handshake: Handshake
    received: int


def receive_as_stranger(
    address: str, kind: Literal["sub", "pull"], *, handshake_timeout_s: float = 30.0, listen_s: float = 2.0
) -> Reception:
    """Connect a keyless SUB or PULL to ``address`` (a run's notices, a trainer's batch inbox), wait for
    its handshake's outcome, then count what arrives within ``listen_s``."""
    context = zmq.Context.instance()
    socket = context.socket(zmq.SUB if kind == "sub" else zmq.PULL)
    if kind == "sub":
        socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.setsockopt(zmq.LINGER, 0)
    monitor = socket.get_monitor_socket(_SUCCEEDED | _FAILED)
    try:
        socket.connect(address)
        handshake = _handshake_outcome(monitor, address, handshake_timeout_s)
        received = 0
        deadline = time.monotonic() + listen_s
        while (left := deadline - time.monotonic()) > 0:
            if socket.poll(int(left * 1000)):
                socket.recv_multipart()
                received += 1
        return Reception(handshake, received)
    finally:
        socket.disable_monitor()
        monitor.close(linger=0)
        socket.close()


def main() -> None:
    """``python -m tests.stranger HOST BASE_PORT``: a stranger on a cluster host tries a run's bound
    sockets on trainer node 0 (rollouts, notices, rank 0's batch inbox both ways) and prints one JSON
    line of what each attempt came to."""
    host, base = sys.argv[1], int(sys.argv[2])
    rollouts, notices, inbox = (f"tcp://{host}:{base + offset}" for offset in (0, 1, 4))
    attempts = {  # at once: the run may not be training for long
        "rollouts": lambda: send_as_stranger(rollouts, GARBAGE),
        "batch_inbox_push": lambda: send_as_stranger(inbox, GARBAGE),
        "notices": lambda: receive_as_stranger(notices, "sub"),
        "batch_inbox_pull": lambda: receive_as_stranger(inbox, "pull"),
    }
    with ThreadPoolExecutor(len(attempts)) as pool:
        futures = {name: pool.submit(attempt) for name, attempt in attempts.items()}
        print(json.dumps({name: future.result().__dict__ for name, future in futures.items()}))


if __name__ == "__main__":
    main()
