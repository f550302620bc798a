"""ZeroMQ sockets that carry wire messages between the stages, with bounded queues.

* ``Sender`` is a PUSH socket (rollouts, train batches) or a PUB socket (weight-update notices).
  A PUSH send blocks while the high-water mark is reached: a slow consumer slows its producer
  (backpressure) instead of letting queues, and memory, grow. A PUB send never blocks; ZeroMQ drops
  messages for a subscriber whose queue is full, so PUB suits notices whose latest value is what counts.
* ``Receiver`` is a PULL socket or a SUB socket subscribed to everything. A multipart message that
  does not decode (``wire.MalformedMessage``) is counted, logged and skipped; the receiver keeps
  running and keeps waiting for the next good message. Its stage counts the message that decodes
  but carries impossible values (``reject``), so a receiver's counts are every rejection there.

Invariants:

* Only ``wire.encode`` / ``wire.decode`` touch the bytes: no pickle on the wire.
* Queues are bounded on both sides (``SNDHWM`` / ``RCVHWM`` = ``high_water_mark`` messages).
* Every socket has ``MAXMSGSIZE`` = ``max_message_bytes`` (``transport.max_message_mib``): ZeroMQ
  reads a part's size prefix and drops the connection of a peer announcing a larger one, before
  allocating it; a receiver counts such dropped connections (``peer_disconnects``, with the peers
  that leave in the ordinary way). ``Sender.send`` refuses to send such a part (``MessageTooLarge``)
  rather than have it vanish at the receiver. ZeroMQ bounds each part, not how many parts a
  multipart message has: only a peer that holds the run's keys (or any local one, on loopback)
  could send that many.
* A PUSH socket that connects sets ``IMMEDIATE``, so it queues nothing for a peer that is not
  there (a message waits in the sender, where backpressure can see it, until a consumer connects).
* ``LINGER`` is 0: closing a socket drops what it has not sent instead of hanging the process.
* Messages are numbered per sending socket (``wire.Envelope``: a stream ``<name>/<pid>/<random>``,
  then 1, 2, ...). A receiver counts numbers skipped (``lost_count``, logged with the gap;
  ``senders_lost_count``: in the streams of the run's own senders, the sender names it was told,
  ``senders``: see ``numbering``) and numbers that come again (rejected as replays); of the messages
  it received, ``senders_received_count`` came from those streams. A receiver built with
  ``on_gap="fail"`` raises ``MessagesLost`` naming the gap instead: the trainer's batch inbox does,
  since a lost batch would leave the trainer and the preprocessor waiting for each other.
* Every bound socket uses ZAP (a ZAP domain, also a socket built without keys): libzmq then refuses a
  peer that does not speak ZMTP 3 (any plain TCP client: without it, libzmq takes such a peer for a
  ZMTP 1.0 one, and a bound PUSH would deal it every other message).
* A bound socket and every receiver count the handshakes their peers failed (``unauthenticated_count``:
  a peer without the run's keys, or with other keys) apart from the connections dropped after a
  handshake that succeeded (``peer_disconnects``), read from the socket's monitor on a thread of its
  own (``socket_events``: an unread monitor would block ZeroMQ's I/O thread).
* A socket is used by one thread at a time (ZeroMQ sockets are not thread-safe).

Security: every stage of a run uses CurveZMQ, on loopback too (``curve_keys``): the launcher writes
the run's key pairs under ``<run_dir>/keys/`` (readable by the run's user only), every binding socket
serves with the server pair and admits only clients presenting the run's client key (a ZAP
authenticator on its context), and every connecting socket presents that client key. Traffic is
encrypted; a peer without the keys is refused during the handshake and its messages never reach the
stage, so it can neither inject, nor forge numbers, nor push a stage's stream out of a receiver's table.
A socket built without keys (``keys=None``: tests, the transport benchmark's plain path) is plain TCP.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Collection
from typing import Literal, Self
from urllib.parse import urlsplit

import zmq

from pipelinerl.platform.curve_keys import (
    KEYS_DIR,
    CurveKeys,
    create_curve_keys,
    present_client_keys,
    release_authentication,
    run_keys,
    serve_with_keys,
)
from pipelinerl.platform.numbering import Gap, Replay, StreamNumbers
from pipelinerl.platform.socket_events import ConnectionEvents
from pipelinerl.platform.wire import (
    MAX_STREAM_NAME,
    Envelope,
    MalformedMessage,
    Message,
    decode_numbered,
    encode_numbered,
)

__all__ = [
    "KEYS_DIR",
    "CurveKeys",
    "MessageTooLarge",
    "MessagesLost",
    "PortInUseError",
    "Receiver",
    "Sender",
    "check_bindable",
    "create_curve_keys",
    "run_keys",
]

logger = logging.getLogger(__name__)

DEFAULT_HIGH_WATER_MARK = 64  # messages; a few optimizer steps of rollouts, bounded memory per socket
DEFAULT_MAX_MESSAGE_BYTES = 256 * 2**20  # transport.max_message_mib's default, for sockets built without it

# Set on every bound socket: with a ZAP domain libzmq refuses legacy (ZMTP 1.0) peers, which is what it
# takes a plain TCP client for. A socket without keys has no ZAP handler: every ZMTP 3 peer passes.
ZAP_DOMAIN = b"pipelinerl"

_SOCKET_TYPES = {"push": zmq.PUSH, "pub": zmq.PUB, "xpub": zmq.XPUB, "pull": zmq.PULL, "sub": zmq.SUB}


def _milliseconds_until(deadline: float) -> int:
    # Rounded up, so a wait never spins on a 0 ms poll before its deadline.
    return max(0, math.ceil((deadline - time.monotonic()) * 1000))


class PortInUseError(RuntimeError):
    """A socket could not bind its address because another process holds the port."""


class MessagesLost(RuntimeError):
    """A receiver built with ``on_gap="fail"`` saw a stream skip numbers: messages were lost on the way."""


class MessageTooLarge(ValueError):
    """A message with a part larger than its socket's ``max_message_bytes``: no receiver would take it."""


def _port_in_use_message(address: str, setting: str | None) -> str:
    what_to_change = f"`{setting}`" if setting else "the port of this address in the run config"
    return (
        f"cannot bind {address}: the port is already in use (another run or program holds it). "
        f"Change {what_to_change} to a free port, or stop the process that holds it."
    )


def check_bindable(address: str, *, setting: str | None = None) -> None:
    """Raise ``PortInUseError`` if the tcp ``address`` cannot be bound now.

    Meant to run before any process starts, so that a taken port fails the launch with a clear
    message. Non-tcp addresses (ipc, inproc) are not checked; a tcp wildcard port (``*`` or 0) is
    always bindable. ``setting`` names the config field that holds the address, for the message.
    """
    parts = urlsplit(address)
    if parts.scheme != "tcp":
        return
    try:
        host, port = parts.hostname, parts.port
    except ValueError as error:  # port not an integer or out of range
        if parts.netloc.endswith(":*"):
            return
        raise ValueError(f"bad tcp address {address!r}: expected tcp://HOST:PORT") from error
    if not host or port is None:
        raise ValueError(f"bad tcp address {address!r}: expected tcp://HOST:PORT")
    if port == 0:
        return
    bind_host = "" if host == "*" else host
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # libzmq sets SO_REUSEADDR on its listeners, so a port in TIME_WAIT is bindable for it too.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((bind_host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise PortInUseError(_port_in_use_message(address, setting)) from error
            raise OSError(error.errno, f"cannot bind {address}: {error.strerror}") from error


class _Socket:
    """A configured ZeroMQ socket, bound or connected to ``address``."""

    def __init__(
        self,
        context: zmq.Context,
        address: str,
        kind: str,
        bind: bool,
        high_water_mark: int,
        setting: str | None,
        keys: CurveKeys | None = None,
        kernel_buffer_bytes: int | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        if high_water_mark < 1:
            raise ValueError(f"high_water_mark must be >= 1 (messages), got {high_water_mark}")
        if max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be >= 1, got {max_message_bytes}")
        self.kind = kind
        self.max_message_bytes = max_message_bytes
        self.socket: zmq.Socket = context.socket(_SOCKET_TYPES[kind])
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        if kernel_buffer_bytes is not None:  # else the kernel's (autotuned, megabytes on loopback)
            self.socket.setsockopt(zmq.SNDBUF, kernel_buffer_bytes)
            self.socket.setsockopt(zmq.RCVBUF, kernel_buffer_bytes)
        if bind and keys is None:  # (a CURVE server always consults its ZAP handler)
            self.socket.zap_domain = ZAP_DOMAIN
        self._serves_keys = keys is not None and bind
        if keys is not None and bind:
            serve_with_keys(self.socket, keys)
        elif keys is not None:
            present_client_keys(self.socket, keys)
        # Refused handshakes and dropped connections, counted from the socket's monitor (``socket_events``);
        # the receivers watch too for the stage they connect to going away.
        self._events = ConnectionEvents(self.socket, address) if bind or kind in ("pull", "sub") else None
        self.socket.setsockopt(zmq.SNDHWM, high_water_mark)
        self.socket.setsockopt(zmq.RCVHWM, high_water_mark)
        if kind == "sub":
            self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        if kind == "xpub":  # every subscription and, as a subscriber goes, its unsubscription
            self.socket.setsockopt(zmq.XPUB_VERBOSER, 1)
        if kind == "push" and not bind:
            self.socket.setsockopt(zmq.IMMEDIATE, 1)
        try:
            if bind:
                self.socket.bind(address)
                # The endpoint actually bound: differs from ``address`` for a wildcard port (tcp://host:*).
                self.address = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
                if self._events is not None:
                    self._events.address = self.address
            else:
                self.socket.connect(address)
                self.address = address
        except zmq.ZMQError as error:
            self.close()
            if error.errno == zmq.EADDRINUSE:
                raise PortInUseError(_port_in_use_message(address, setting)) from error
            raise

    @property
    def unauthenticated_count(self) -> int:
        """Peers refused in the handshake so far (no keys, other keys): none of their frames was read."""
        return 0 if self._events is None else self._events.unauthenticated

    @property
    def peer_disconnects(self) -> int:
        """Connections dropped after a handshake that succeeded (an oversized part among the reasons)."""
        return 0 if self._events is None else self._events.disconnects

    def _close_monitor(self) -> None:
        if self._events is not None:
            self._events.stop()

    def close(self) -> None:
        """Close the socket at once, dropping unsent messages; closing twice is harmless."""
        self._close_monitor()
        self.socket.close(linger=0)
        if self._serves_keys:  # the context's last CURVE server stops its ZAP thread
            self._serves_keys = False
            release_authentication(self.socket.context)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Sender(_Socket):
    """Sends wire messages on a PUSH (bounded, blocking when full), PUB or XPUB socket.

    An XPUB is a PUB that sees its subscribers come and go (``subscribers``): a PUB drops what it
    sends before a subscriber's subscription has arrived (ZeroMQ's "slow joiner"), which on a slow
    link can be the first notice a stage must not miss; the sender waits for them first
    (``wait_for_subscribers``)."""

    def __init__(
        self,
        context: zmq.Context,
        address: str,
        kind: Literal["push", "pub", "xpub"],
        bind: bool,
        high_water_mark: int = DEFAULT_HIGH_WATER_MARK,
        *,
        setting: str | None = None,
        keys: CurveKeys | None = None,
        kernel_buffer_bytes: int | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        name: str | None = None,
    ) -> None:
        if kind not in ("push", "pub", "xpub"):
            raise ValueError(f"Sender kind must be 'push', 'pub' or 'xpub', got {kind!r}")
        # Unique to this socket (and so to this incarnation of its stage); ``name`` says whose it is,
        # and is what a receiver pins (``numbering``).
        sender = name or kind
        stream = f"{sender}/{os.getpid()}/{secrets.token_hex(3)}"
        if "/" in sender or len(stream) > MAX_STREAM_NAME:
            raise ValueError(
                f"Sender name {sender!r}: give a name without '/' that keeps its stream name "
                f"{stream!r} within {MAX_STREAM_NAME} characters"
            )
        super().__init__(
            context,
            address,
            kind,
            bind,
            high_water_mark,
            setting,
            keys,
            kernel_buffer_bytes,
            max_message_bytes,
        )
        self.stream = stream
        self.sent_count = 0
        self._subscribers = 0

    def send(self, message: Message, timeout_s: float | None = None) -> bool:
        """Send ``message``; True once ZeroMQ has queued it.

        PUSH: waits while the queue is full (or, when connecting, until a peer is there), at most
        ``timeout_s`` seconds (None: forever), and returns False if it is still full by then; the
        message is then not sent. PUB: never waits (a full subscriber queue drops it) and returns True.
        ``MessageTooLarge`` if a part of it exceeds ``max_message_bytes``.
        """
        # Numbered when built: a message not sent (timeout) leaves its number to the next one.
        frames = encode_numbered(message, Envelope(self.stream, self.sent_count + 1))
        largest = max(len(frame) for frame in frames)
        if largest > self.max_message_bytes:
            raise MessageTooLarge(
                f"a {type(message).__name__} part of {largest / 2**20:.1f} MiB exceeds the "
                f"{self.max_message_bytes / 2**20:.1f} MiB every receiver accepts: "
                "raise transport.max_message_mib"
            )
        if timeout_s is None or self.kind in ("pub", "xpub"):
            self.socket.send_multipart(frames)
            self.sent_count += 1
            return True
        deadline = time.monotonic() + timeout_s
        while True:
            remaining_ms = _milliseconds_until(deadline)
            if self.socket.poll(remaining_ms, zmq.POLLOUT):
                try:
                    # Multipart messages are atomic: once the first frame is accepted, all are.
                    self.socket.send_multipart(frames, flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass  # another peer's queue filled between poll and send; wait again
                else:
                    self.sent_count += 1
                    return True
            if time.monotonic() >= deadline:
                return False

    def subscribers(self) -> int:
        """XPUB: the subscribers there now (each one's subscription counted in, its unsubscription,
        when it goes, out). Only authenticated peers get as far as subscribing."""
        if self.kind != "xpub":
            raise ValueError(f"a {self.kind} socket does not see its subscribers; use 'xpub'")
        while self.socket.poll(0, zmq.POLLIN):
            frame = self.socket.recv()
            if frame[:1] == b"\x01":
                self._subscribers += 1
            elif frame[:1] == b"\x00":
                self._subscribers = max(0, self._subscribers - 1)
        return self._subscribers

    def wait_for_subscribers(self, count: int, timeout_s: float, poll_s: float = 0.01) -> bool:
        """XPUB: wait until at least ``count`` subscribers are there, at most ``timeout_s``; whether
        they are."""
        deadline = time.monotonic() + timeout_s
        while self.subscribers() < count:
            if time.monotonic() >= deadline:
                return False
            self.socket.poll(int(poll_s * 1000), zmq.POLLIN)
        return True


class Receiver(_Socket):
    """Receives wire messages on a PULL socket or a SUB socket subscribed to every message."""

    def __init__(
        self,
        context: zmq.Context,
        address: str,
        kind: Literal["pull", "sub"],
        bind: bool,
        high_water_mark: int = DEFAULT_HIGH_WATER_MARK,
        *,
        setting: str | None = None,
        keys: CurveKeys | None = None,
        kernel_buffer_bytes: int | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        on_gap: Literal["count", "fail"] = "count",
        senders: Collection[str] = (),
    ) -> None:
        if kind not in ("pull", "sub"):
            raise ValueError(f"Receiver kind must be 'pull' or 'sub', got {kind!r}")
        if on_gap not in ("count", "fail"):
            raise ValueError(f"on_gap must be 'count' or 'fail', got {on_gap!r}")
        super().__init__(
            context,
            address,
            kind,
            bind,
            high_water_mark,
            setting,
            keys,
            kernel_buffer_bytes,
            max_message_bytes,
        )
        self.on_gap = on_gap
        # A PULL sees each stream from its first message; a SUB may join one late (slow joiner).
        # The streams of the run's own senders (sender names ``senders``: every stream named
        # ``<sender>/...``) are tracked apart from the bounded table and their losses counted apart.
        self.numbers = StreamNumbers(expect_first=kind == "pull", pinned=senders)
        self.lost_count = 0
        self.senders_lost_count = 0
        self.received_count = 0
        self.senders_received_count = 0
        self.malformed_count = 0
        self.rejected_count = 0

    def reject(self, what: str, reason: str) -> None:
        """Count and log a message that decoded but that its stage cannot use (impossible values)."""
        self.rejected_count += 1
        logger.warning("rejected %s on %s (%d so far): %s", what, self.address, self.rejected_count, reason)

    def recv(self, timeout_s: float | None = None) -> Message | None:
        """The next good message, or None if none came within ``timeout_s`` seconds (None: wait forever).

        Malformed messages on the way are counted in ``malformed_count``, logged and skipped.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if deadline is None:
                self.socket.poll(None, zmq.POLLIN)
            else:
                remaining_ms = _milliseconds_until(deadline)
                if not self.socket.poll(remaining_ms, zmq.POLLIN):
                    return None
            try:
                frames = self.socket.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                continue
            try:
                envelope, message = decode_numbered(frames)
            except MalformedMessage as error:
                self.malformed_count += 1
                logger.warning(
                    "skipped a malformed message on %s (%d so far): %s",
                    self.address,
                    self.malformed_count,
                    error.reason,
                )
                continue
            verdict = self.numbers.observe(envelope.stream, envelope.seq)
            if isinstance(verdict, Replay):
                self.reject(f"{type(message).__name__} #{envelope.seq}", verdict.describe())
                continue
            if isinstance(verdict, Gap):
                self._lost(verdict)
            self.received_count += 1
            if self.numbers.is_pinned(envelope.stream):
                self.senders_received_count += 1
            return message

    def _lost(self, gap: Gap) -> None:
        self.lost_count += gap.lost
        if self.numbers.is_pinned(gap.stream):
            self.senders_lost_count += gap.lost
        what = f"on {self.address}: {gap.describe()}"
        if self.on_gap == "fail":
            raise MessagesLost(
                f"{what}. Nothing between two stages of a run may be lost; a peer that is not a stage "
                "of this run may have taken them (see docs/reliability.md)"
            )
        logger.warning("lost %s (%d lost so far)", what, self.lost_count)
