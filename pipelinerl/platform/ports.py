"""A free TCP port, asked of the kernel (no torch, no ZeroMQ: the doctor and the replay's rendezvous)."""

from __future__ import annotations

import socket


def free_port(host: str) -> int:
    """A port the kernel hands out on ``host`` now (bound to port 0, then released)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
