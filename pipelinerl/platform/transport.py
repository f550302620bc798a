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
* Messages are numbered per sending socket (``wire.Envelope``: a stream name, then 1, 2, ...). A
  receiver counts numbers skipped (``lost_count``, logged with the gap; ``senders_lost_count``: of
  the streams it was told to expect, the run's own senders) and numbers that come again (rejected as
  replays). A receiver built with ``on_gap="fail"`` raises ``MessagesLost`` naming the
  gap instead: the trainer's batch inbox does, since a lost batch would leave the trainer and the
  preprocessor waiting for each other.
* Every bound socket uses ZAP, also on loopback without CurveZMQ (a ZAP domain): libzmq then refuses a peer
  that does not speak ZMTP 3 (any plain TCP client: without it, libzmq takes such a peer for a
  ZMTP 1.0 one, and a bound PUSH would deal it every other message).
* A socket is used by one thread at a time (ZeroMQ sockets are not thread-safe).

Security: on loopback the sockets are plain TCP. A run whose ``transport.host`` is any other
address (stages on several nodes) uses CurveZMQ: the launcher writes the run's key pairs under
``<run_dir>/keys/`` (``create_curve_keys``), every binding socket serves with the server pair and
admits only clients presenting the run's client key (a ZAP authenticator on its context), and every
connecting socket presents that client key. Traffic is encrypted; a peer without the keys is refused
during the handshake and its messages never reach the stage.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import math
import os
import secrets
import socket
import time
import weakref
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import urlsplit

import zmq
from zmq.utils.monitor import recv_monitor_message

from pipelinerl.platform.numbering import Gap, Replay, StreamNumbers
from pipelinerl.platform.wire import (
    MAX_STREAM_NAME,
    Envelope,
    MalformedMessage,
    Message,
    decode_numbered,
    encode_numbered,
)

logger = logging.getLogger(__name__)

DEFAULT_HIGH_WATER_MARK = 64  # messages; a few optimizer steps of rollouts, bounded memory per socket
DEFAULT_MAX_MESSAGE_BYTES = 256 * 2**20  # transport.max_message_mib's default, for sockets built without it

# Set on every bound socket: with a ZAP domain libzmq refuses legacy (ZMTP 1.0) peers, which is what it
# takes a plain TCP client for. With no ZAP handler in the process (loopback), every ZMTP 3 peer passes.
ZAP_DOMAIN = b"pipelinerl"

_SOCKET_TYPES = {"push": zmq.PUSH, "pub": zmq.PUB, "pull": zmq.PULL, "sub": zmq.SUB}


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


KEYS_DIR = "keys"
_SERVER, _CLIENT = "server", "client"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass(frozen=True)
class CurveKeys:
    """A run's CurveZMQ keys (Z85): binding sockets serve with the server pair, connecting ones
    present the client pair; ``allowed_dir`` holds the public keys a server admits."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes
    allowed_dir: Path


def create_curve_keys(run_dir: Path) -> Path:
    """Write a new server and client key pair under ``<run_dir>/keys/`` (secrets readable by the
    owner only) unless they exist; returns the directory."""
    import zmq.auth

    directory = run_dir / KEYS_DIR
    if (directory / f"{_CLIENT}.key_secret").exists():
        return directory
    (directory / "allowed").mkdir(parents=True, exist_ok=True)
    for name in (_SERVER, _CLIENT):
        public_file, secret_file = zmq.auth.create_certificates(directory, name)
        os.chmod(secret_file, 0o600)
    (directory / "allowed" / f"{_CLIENT}.key").write_bytes((directory / f"{_CLIENT}.key").read_bytes())
    return directory


def run_keys(host: str, run_dir: Path) -> CurveKeys | None:
    """The keys a stage of the run uses: None on loopback; else read from ``<run_dir>/keys/``."""
    import zmq.auth

    if is_loopback(host):
        return None
    directory = run_dir / KEYS_DIR
    try:
        server_public, server_secret = zmq.auth.load_certificate(directory / f"{_SERVER}.key_secret")
        client_public, client_secret = zmq.auth.load_certificate(directory / f"{_CLIENT}.key_secret")
    except (OSError, ValueError) as error:
        raise ValueError(
            f"transport.host={host!r} is not loopback, so the sockets need the run's CurveZMQ keys in "
            f"{directory} (the launcher writes them): {error}"
        ) from None
    if server_secret is None or client_secret is None:
        raise ValueError(f"{directory} lacks a secret key")
    return CurveKeys(server_public, server_secret, client_public, client_secret, directory / "allowed")


_authenticators: weakref.WeakKeyDictionary[zmq.Context, Any] = weakref.WeakKeyDictionary()


def _authenticate(context: zmq.Context, keys: CurveKeys) -> None:
    """Admit only the run's client key on ``context``'s CURVE servers (one ZAP thread per context)."""
    if context in _authenticators:
        return
    from zmq.auth.thread import ThreadAuthenticator

    authenticator = ThreadAuthenticator(context, log=logging.getLogger("pipelinerl.transport.zap"))
    authenticator.start()
    authenticator.configure_curve(domain="*", location=str(keys.allowed_dir))
    _authenticators[context] = authenticator


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
        if keys is not None and bind:
            _authenticate(context, keys)
            self.socket.curve_server = True
            self.socket.curve_secretkey = keys.server_secret
            self.socket.curve_publickey = keys.server_public
        elif keys is not None:
            self.socket.curve_serverkey = keys.server_public
            self.socket.curve_publickey = keys.client_public
            self.socket.curve_secretkey = keys.client_secret
        self.socket.setsockopt(zmq.SNDHWM, high_water_mark)
        self.socket.setsockopt(zmq.RCVHWM, high_water_mark)
        if kind == "sub":
            self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        if kind == "push" and not bind:
            self.socket.setsockopt(zmq.IMMEDIATE, 1)
        try:
            if bind:
                self.socket.bind(address)
                # The endpoint actually bound: differs from ``address`` for a wildcard port (tcp://host:*).
                self.address = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
            else:
                self.socket.connect(address)
                self.address = address
        except zmq.ZMQError as error:
            self.socket.close(linger=0)
            if error.errno == zmq.EADDRINUSE:
                raise PortInUseError(_port_in_use_message(address, setting)) from error
            raise

    def close(self) -> None:
        """Close the socket at once, dropping unsent messages; closing twice is harmless."""
        self.socket.close(linger=0)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Sender(_Socket):
    """Sends wire messages on a PUSH (bounded, blocking when full) or PUB socket."""

    def __init__(
        self,
        context: zmq.Context,
        address: str,
        kind: Literal["push", "pub"],
        bind: bool,
        high_water_mark: int = DEFAULT_HIGH_WATER_MARK,
        *,
        setting: str | None = None,
        keys: CurveKeys | None = None,
        kernel_buffer_bytes: int | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        name: str | None = None,
    ) -> None:
        if kind not in ("push", "pub"):
            raise ValueError(f"Sender kind must be 'push' or 'pub', got {kind!r}")
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
        self.sent_count = 0
        # Unique to this socket (and so to this incarnation of its stage); ``name`` says whose it is.
        self.stream = f"{name or kind}/{os.getpid()}/{secrets.token_hex(3)}"[-MAX_STREAM_NAME:]

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
        if timeout_s is None or self.kind == "pub":
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
        # The run's own senders' streams (``senders``) are tracked for good and their losses counted
        # apart: a stranger's forged numbers make gaps only in its own streams.
        self.numbers = StreamNumbers(expect_first=kind == "pull", pinned=senders)
        self.lost_count = 0
        self.senders_lost_count = 0
        self.received_count = 0
        self.malformed_count = 0
        self.rejected_count = 0
        self.peer_disconnects = 0
        # ZeroMQ's only sign of an oversized part is the connection it drops: watch for those.
        self._monitor: zmq.Socket | None = self.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def reject(self, what: str, reason: str) -> None:
        """Count and log a message that decoded but that its stage cannot use (impossible values)."""
        self.rejected_count += 1
        logger.warning("rejected %s on %s (%d so far): %s", what, self.address, self.rejected_count, reason)

    def _count_disconnects(self) -> None:
        if self._monitor is None:
            return
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self.peer_disconnects += 1
                logger.warning(
                    "a peer of %s disconnected (%d so far; an oversized message part also drops its "
                    "connection)",
                    self.address,
                    self.peer_disconnects,
                )

    def close(self) -> None:
        if self._monitor is not None:
            self.socket.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
        super().close()

    def recv(self, timeout_s: float | None = None) -> Message | None:
        """The next good message, or None if none came within ``timeout_s`` seconds (None: wait forever).

        Malformed messages on the way are counted in ``malformed_count``, logged and skipped.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            self._count_disconnects()
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
            return message

    def _lost(self, gap: Gap) -> None:
        self.lost_count += gap.lost
        if gap.stream in self.numbers.pinned:
            self.senders_lost_count += gap.lost
        what = f"on {self.address}: {gap.describe()}"
        if self.on_gap == "fail":
            raise MessagesLost(
                f"{what}. Nothing between two stages of a run may be lost; a peer that is not a stage "
                "of this run may have taken them (see docs/reliability.md)"
            )
        logger.warning("lost %s (%d lost so far)", what, self.lost_count)
