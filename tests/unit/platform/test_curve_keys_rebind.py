"""A context whose last CURVE server closed can serve again at once (the bench transport peer does,
between two measurements): the new ZAP thread waits for ZeroMQ to finish closing the old one's socket.

Without the wait (``curve_keys.ZAP_REBIND_S`` negative) this loop met "Address already in use" on
inproc://zeromq.zap.01 within its 300 restarts on this machine, as `bench transport --quick` once did."""

from __future__ import annotations

from pathlib import Path

import zmq

from pipelinerl.platform.curve_keys import (
    create_curve_keys,
    release_authentication,
    run_keys,
    serve_with_keys,
    stop_authentication,
)


def test_a_context_serves_again_right_after_its_last_server_closed(tmp_path: Path) -> None:
    create_curve_keys(tmp_path)
    keys = run_keys(tmp_path)
    context = zmq.Context()
    try:
        for _ in range(300):
            server = context.socket(zmq.PULL)
            serve_with_keys(server, keys)
            server.bind("tcp://127.0.0.1:0")
            server.close(linger=0)
            release_authentication(context)  # the last server closed: the ZAP thread stops
    finally:
        stop_authentication(context)
        context.destroy(linger=0)
