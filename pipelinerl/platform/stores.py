"""torch.distributed rendezvous stores and gloo devices that listen on the run's host address only.

A ``TCPStore`` server listens on every interface (``::``) whatever host it is given, and gloo listens on
the address the machine's host name resolves to. Both are unauthenticated: anyone who reaches them can
set and delete keys of a rendezvous or join a group. So the run binds them where they are needed,
``transport.host`` (on loopback: 127.0.0.1), and nowhere else:

* ``host_store``: the store's server is handed a socket already bound to ``host`` and listening
  (``TCPStore(master_listen_fd=...)``); members connect as before. The weight group's store
  (``weights``) and the trainer ranks' rendezvous (``init_trainer_group``) are built by it.
* ``gloo_device``: a gloo device bound to ``host`` where this machine holds that address; a member on
  another node binds the address its kernel routes ``host``'s traffic from (``address_towards``), never
  the address its host name resolves to, which is loopback on many machines (Debian maps the host name
  to 127.0.1.1) and unreachable to the peers.
* ``init_trainer_group``: the trainer ranks' default process group, initialised on a ``host_store``
  before DeepSpeed's ``init_distributed`` (which then finds the group initialised and uses it). gloo
  takes its device for a default group only from ``GLOO_SOCKET_IFNAME``, so it is set to the interface
  that holds ``host`` (on another node: the interface that reaches it) unless the user set it.

What remains exposed (docs/reliability.md, "Authenticated wire"): on several hosts the stores listen
on a network address, still without authentication; NCCL's own bootstrap sockets follow
``NCCL_SOCKET_IFNAME``, which the run leaves to the user.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
import time
from datetime import timedelta

import psutil
import torch.distributed as dist

logger = logging.getLogger(__name__)

# Connections the store's listening socket queues before it accepts them: every rank of a large job
# may connect at once (torch's own store backlog is of this order).
LISTEN_BACKLOG = 2048
GLOO_INTERFACE_ENV = "GLOO_SOCKET_IFNAME"
LISTENER_POLL_S = 0.05  # how often a store client looks for its server


def _address_family(host: str, port: int) -> tuple[socket.AddressFamily, tuple[str, int]]:
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as error:
        raise ValueError(f"transport.host {host!r} does not resolve to an address: {error}") from None
    return family, (str(address[0]), int(address[1]))


def _listening_socket(host: str, port: int) -> socket.socket:
    family, address = _address_family(host, port)
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        # As torch's store does: a port a previous run left in TIME_WAIT is bindable.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(LISTEN_BACKLOG)
    except OSError as error:
        listener.close()
        if error.errno == errno.EADDRINUSE:
            raise OSError(
                error.errno,
                f"cannot bind the rendezvous store at {host}:{port}: the port is already in use (another "
                "run or program holds it); change transport.base_port or stop that process",
            ) from error
        raise OSError(
            error.errno, f"cannot bind the rendezvous store at {host}:{port}: {error.strerror}"
        ) from error
    return listener


def host_store(
    host: str, port: int, world_size: int, *, is_master: bool, timeout: timedelta
) -> dist.TCPStore:
    """A ``TCPStore`` whose server (``is_master``) listens on ``host:port`` only; a client connects to it,
    once the server listens (``wait_for_listener``)."""
    if not is_master:
        wait_for_listener(host, port, timeout.total_seconds())
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    listener = _listening_socket(host, port)
    descriptor = listener.detach()  # the store owns it now and closes it when it goes
    try:
        return dist.TCPStore(
            host,
            port,
            world_size,
            is_master=True,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=descriptor,
        )
    except BaseException:
        os.close(descriptor)
        raise


def wait_for_listener(host: str, port: int, timeout_s: float, poll_s: float = LISTENER_POLL_S) -> bool:
    """Wait until something accepts TCP connections at ``host:port`` (True), or ``timeout_s`` passed.

    A store client started before its server retries with a growing back-off: it joined 2.7 s after a
    server that came up 3 s late, which every actor paid again at a restart of the trainer role. A plain
    connection, closed at once, is what the server sees of this probe."""
    family, address = _address_family(host, port)
    deadline = time.monotonic() + timeout_s
    while True:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.settimeout(max(poll_s, 0.5))
            if probe.connect_ex(address) == 0:
                return True
        if time.monotonic() >= deadline:
            return False  # the store's own connection reports it
        time.sleep(poll_s)


def holds_address(host: str) -> bool:
    """Whether this machine has ``host``'s address (a socket can be bound to it)."""
    try:
        family, address = _address_family(host, 0)
    except ValueError:
        return False
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(address)
        except OSError:
            return False
    return True


def address_towards(host: str) -> str | None:
    """The address of this machine that the kernel sends ``host``'s traffic from (the local end of a
    connected UDP socket: routing only, nothing is sent), or None where ``host`` is unreachable."""
    try:
        family, (address, _) = _address_family(host, 9)
    except ValueError:
        return None
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, 9))
        except OSError:  # no route to it
            return None
        return str(probe.getsockname()[0])


def local_address(host: str) -> str | None:
    """Where this machine's end of a link with ``host`` should listen: ``host`` itself where this
    machine holds it, else the address that reaches it."""
    return host if holds_address(host) else address_towards(host)


def gloo_device(host: str) -> dist.ProcessGroupGloo.Device:
    """A gloo device that listens on ``host`` where this machine holds it, else on the address that
    reaches ``host``; gloo's default device (the host name's address) only where neither is known."""
    local = local_address(host)
    if local is not None:
        return dist.ProcessGroupGloo.create_device(hostname=local)
    logger.warning("no route from this machine to %s: gloo listens where the host name resolves", host)
    return dist.ProcessGroupGloo.create_default_device()


def interface_of(host: str) -> str | None:
    """The name of this machine's network interface that holds ``host``'s address, or None."""
    try:
        _, (address, _) = _address_family(host, 0)
        wanted = ipaddress.ip_address(address)
    except ValueError:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        for entry in addresses:
            if entry.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                if ipaddress.ip_address(entry.address.split("%", 1)[0]) == wanted:
                    return name
            except ValueError:
                continue
    return None


def init_trainer_group(
    backend: str, host: str, port: int, rank: int, world_size: int, timeout: timedelta
) -> None:
    """The trainer ranks' default process group, its rendezvous store on ``host:port`` only (rank 0
    serves it) and, with gloo, its sockets on ``host``'s interface where this machine has it."""
    if backend == "gloo" and not os.environ.get(GLOO_INTERFACE_ENV):
        local = local_address(host)
        interface = interface_of(local) if local is not None else None
        if interface is not None:
            os.environ[GLOO_INTERFACE_ENV] = interface
        else:
            logger.warning(
                "no interface of this machine holds or reaches %s: gloo listens where the host name resolves",
                host,
            )
    store = host_store(host, port, world_size, is_master=rank == 0, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
