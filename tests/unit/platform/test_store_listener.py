"""A store client waits for its server to listen before it connects (``stores.wait_for_listener``)."""

from __future__ import annotations

import socket
import threading
import time

from pipelinerl.platform.stores import wait_for_listener


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_server_that_comes_up_late_is_seen_as_soon_as_it_listens() -> None:
    port = free_port()
    listening = threading.Event()
    server = socket.socket()

    def listen_later() -> None:
        time.sleep(0.5)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen(4)
        listening.set()

    thread = threading.Thread(target=listen_later)
    thread.start()
    try:
        assert wait_for_listener("127.0.0.1", port, timeout_s=60, poll_s=0.01)
        assert listening.is_set(), "it returned before anything listened"
    finally:
        thread.join()
        server.close()


def test_no_server_within_the_timeout_is_said() -> None:
    assert not wait_for_listener("127.0.0.1", free_port(), timeout_s=0.2, poll_s=0.05)
