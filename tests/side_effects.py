"""Witnesses of side effects an untrusted answer must not have: a directory anyone may write to and a
listening socket that must receive no connection (the scoring sandbox's tests)."""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def drop() -> Iterator[Path]:
    """A directory anyone may write to, so only the sandbox (not its permissions) can keep it empty."""
    directory = Path(tempfile.mkdtemp(prefix="pipelinerl-drop-"))
    directory.chmod(0o1777)
    yield directory
    shutil.rmtree(directory)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening TCP socket on loopback that must receive no connection."""
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    yield server
    server.close()


def connections(server: socket.socket) -> int:
    """How many connections ``server`` has received (and closed here) so far."""
    count = 0
    while True:
        try:
            connection, _ = server.accept()
        except BlockingIOError:
            return count
        connection.close()
        count += 1
