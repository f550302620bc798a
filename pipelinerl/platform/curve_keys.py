"""A run's CurveZMQ keys: written once by the launcher, read by every stage, enforced by a ZAP handler.

Every run authenticates its peers, on loopback too (docs/reliability.md, "Authenticated wire"): any
other process on the machine can connect to a loopback port, so a port is no boundary. The launcher
writes a server and a client key pair under ``<run_dir>/keys/`` (``create_curve_keys``: the directory
mode 0700, every key file 0600, readable by the run's user only); every socket a stage binds serves
with the server pair and admits only peers presenting the run's client key (a ZAP authenticator
thread on its ZeroMQ context, ``authenticate``), and every socket a stage connects presents the
client pair (``present_client_keys``). A peer without the keys fails the handshake: not one of its
frames reaches the stage. Traffic is encrypted as well.

``run_keys`` refuses key files that other users can read (the run's keys are its only secret).
"""

from __future__ import annotations

import logging
import os
import stat
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

logger = logging.getLogger(__name__)

KEYS_DIR = "keys"
_SERVER, _CLIENT = "server", "client"
# Only the run's user may read or list the keys (and, inside, the secrets).
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


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
    """Write a new server and client key pair under ``<run_dir>/keys/`` unless they exist (the
    directories 0700, the files 0600, also when they existed); returns the directory."""
    directory = run_dir / KEYS_DIR
    allowed = directory / "allowed"
    for path in (directory, allowed):
        path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        os.chmod(path, PRIVATE_DIR_MODE)  # mkdir's mode passes through the umask; this does not
    if not (directory / f"{_CLIENT}.key_secret").exists():
        # The files are written inside the private directory, so no other user sees them before chmod.
        for name in (_SERVER, _CLIENT):
            zmq.auth.create_certificates(directory, name)
        (allowed / f"{_CLIENT}.key").write_bytes((directory / f"{_CLIENT}.key").read_bytes())
    for path in [*directory.iterdir(), *allowed.iterdir()]:
        if path.is_file():
            os.chmod(path, PRIVATE_FILE_MODE)
    return directory


def run_keys(run_dir: Path) -> CurveKeys:
    """The keys every stage of the run uses, read from ``<run_dir>/keys/`` (written by the launcher).

    ``ValueError`` naming the directory if they are missing, or naming the file and its mode if a
    secret can be read by other users than its owner.
    """
    directory = run_dir / KEYS_DIR
    try:
        for name in (_SERVER, _CLIENT):
            _check_private(directory / f"{name}.key_secret")
        server_public, server_secret = zmq.auth.load_certificate(directory / f"{_SERVER}.key_secret")
        client_public, client_secret = zmq.auth.load_certificate(directory / f"{_CLIENT}.key_secret")
    except (OSError, ValueError) as error:
        raise ValueError(
            f"the run's sockets need its CurveZMQ keys in {directory} (the launcher writes them, "
            f"pipelinerl.platform.curve_keys.create_curve_keys): {error}"
        ) from None
    if server_secret is None or client_secret is None:
        raise ValueError(f"{directory} lacks a secret key (server.key_secret and client.key_secret)")
    return CurveKeys(server_public, server_secret, client_public, client_secret, directory / "allowed")


def _check_private(path: Path) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ValueError(
            f"{path} has mode {mode:o}: other users could read the run's secret key; "
            f"it must be {PRIVATE_FILE_MODE:o} (chmod {PRIVATE_FILE_MODE:o} {path})"
        )


_authenticators: weakref.WeakKeyDictionary[zmq.Context[Any], Any] = weakref.WeakKeyDictionary()
_servers: weakref.WeakKeyDictionary[zmq.Context[Any], int] = weakref.WeakKeyDictionary()


def authenticate(context: zmq.Context[Any], keys: CurveKeys) -> None:
    """Admit only the run's client key on ``context``'s CURVE servers (one ZAP thread per context,
    started by its first server, stopped by ``release_authentication`` once its last one closed)."""
    _servers[context] = _servers.get(context, 0) + 1
    if context in _authenticators:
        return
    authenticator = _started_authenticator(context)
    authenticator.configure_curve(domain="*", location=str(keys.allowed_dir))
    _authenticators[context] = authenticator


# How long a new ZAP thread waits for the socket of the context's previous one to be gone.
ZAP_REBIND_S = 10.0


def _started_authenticator(context: zmq.Context[Any]) -> Any:
    """A started ZAP thread on ``context``. ZeroMQ closes a socket in its I/O thread, after ``close()``
    returns: a server opened right after the context's last one closed (``release_authentication``)
    can find the ZAP endpoint still bound, and then waits for the close to finish (a benchmark's
    peer does this between two measurements)."""
    deadline = time.monotonic() + ZAP_REBIND_S
    while True:
        authenticator = ThreadAuthenticator(context, log=logging.getLogger("pipelinerl.transport.zap"))
        try:
            authenticator.start()
            return authenticator
        except zmq.ZMQError as error:
            authenticator.stop()  # closes the socket whose bind failed
            if error.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def release_authentication(context: zmq.Context[Any]) -> None:
    """A CURVE server of ``context`` closed; the last one stops the context's ZAP thread, whose socket
    would otherwise keep ``context.term()`` waiting for ever."""
    remaining = _servers.get(context, 0) - 1
    if remaining > 0:
        _servers[context] = remaining
    else:
        stop_authentication(context)


def stop_authentication(context: zmq.Context[Any]) -> None:
    """Stop ``context``'s ZAP thread, if it has one, whatever still serves: before ``context.destroy``
    of a context whose servers were not all closed (a benchmark's)."""
    _servers.pop(context, None)
    authenticator = _authenticators.pop(context, None)
    if authenticator is not None:
        authenticator.stop()


def serve_with_keys(socket: zmq.Socket[Any], keys: CurveKeys) -> None:
    """Make ``socket`` (before it binds) a CURVE server of the run's keys, admitting its client key;
    when it closes, call ``release_authentication(socket.context)``."""
    authenticate(socket.context, keys)
    socket.curve_server = True
    socket.curve_secretkey = keys.server_secret
    socket.curve_publickey = keys.server_public


def present_client_keys(socket: zmq.Socket[Any], keys: CurveKeys) -> None:
    """Make ``socket`` (before it connects) present the run's client keys to the run's server."""
    socket.curve_serverkey = keys.server_public
    socket.curve_publickey = keys.client_public
    socket.curve_secretkey = keys.client_secret
