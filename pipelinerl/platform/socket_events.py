"""Counts of what happened to a ZeroMQ socket's connections, read from its monitor on a thread of its own.

ZeroMQ's only signs of a peer refused in the handshake (no CurveZMQ keys, other keys) and of a
connection it dropped (a part over ``MAXMSGSIZE``, a peer that left) are events on the socket's
monitor. The monitor must be read at once: libzmq's I/O thread blocks sending an event once about a
thousand wait unread, and with it every socket of the context (checked: 4,000 plain TCP connections
to a bound socket whose monitor nobody read hung the listener). A stage that waits on another socket
for a while (the preprocessor holding a batch for the trainer) would then never get its message, and a
local process opening connections could stall the run. So ``ConnectionEvents`` reads the monitor on a
daemon thread for the socket's life:

* ``unauthenticated``: handshakes that failed (``EVENT_HANDSHAKE_FAILED_*``);
* ``disconnects``: connections dropped after a handshake that succeeded (a refused peer's connection
  ends too, but it is counted once, as refused).

Both are logged as they grow (every one of the first ten, then at powers of two).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

logger = logging.getLogger("pipelinerl.platform.transport")

# A peer's handshake failed: no keys (a NULL mechanism against a CURVE server), other keys, a client key
# the ZAP handler refuses, or a connection that closed before it finished.
HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_WATCHED = HANDSHAKE_FAILED | zmq.EVENT_DISCONNECTED | zmq.EVENT_MONITOR_STOPPED
STOP_TIMEOUT_S = 5.0  # the reader ends at the monitor's last event, sent when the socket stops it
# Each count is logged at 1..LOG_EVERY_UP_TO, then at powers of two: a peer opening connections by the
# thousand must not fill the disk with log lines (the counts themselves are exact).
LOG_EVERY_UP_TO = 10


def _worth_logging(count: int) -> bool:
    return count <= LOG_EVERY_UP_TO or count & (count - 1) == 0


class ConnectionEvents:
    """The running counts of one socket's refused handshakes and dropped connections."""

    def __init__(self, socket: zmq.Socket[Any], address: str) -> None:
        self.address = address
        self.unauthenticated = 0
        self.disconnects = 0
        self._failed_unclosed = 0  # refused peers whose DISCONNECTED event is still to come
        self._socket = socket
        monitor = socket.get_monitor_socket(_WATCHED)
        # The monitor socket belongs to the reader thread from here on (ZeroMQ sockets are not thread-safe).
        self._thread = threading.Thread(
            target=self._read, args=(monitor,), name=f"zmq-events {address}", daemon=True
        )
        self._thread.start()

    def _read(self, monitor: zmq.Socket[Any]) -> None:
        try:
            while True:
                event = recv_monitor_message(monitor)["event"]
                if event == zmq.EVENT_MONITOR_STOPPED:
                    return
                self._count(event)
        except zmq.ZMQError:  # the context was terminated under it
            return
        finally:
            monitor.close(linger=0)

    def _count(self, event: int) -> None:
        if event & HANDSHAKE_FAILED:
            self.unauthenticated += 1
            self._failed_unclosed += 1
            if _worth_logging(self.unauthenticated):
                logger.warning(
                    "refused a peer of %s in the handshake: it lacks the run's keys (%d so far)",
                    self.address,
                    self.unauthenticated,
                )
        elif event == zmq.EVENT_DISCONNECTED and self._failed_unclosed:
            self._failed_unclosed -= 1  # the refused peer's connection, already counted
        elif event == zmq.EVENT_DISCONNECTED:
            self.disconnects += 1
            if _worth_logging(self.disconnects):
                logger.warning(
                    "a peer of %s disconnected (%d so far; an oversized message part also drops its "
                    "connection)",
                    self.address,
                    self.disconnects,
                )

    def stop(self) -> None:
        """Stop monitoring (before the socket closes); the reader ends at the monitor's last event."""
        if self._socket.closed:
            return
        self._socket.disable_monitor()
        self._thread.join(timeout=STOP_TIMEOUT_S)
