"""torch.distributed rendezvous stores and gloo devices that listen on the run's host address only.

A ``TCPStore`` server listens on every interface (``::``) whatever host it is given, and gloo listens on
the address the machine's host name resolves to. Both are unauthenticated: anyone who reaches them can
set and delete keys of a rendezvous or join a group. So the run binds them where they are needed,
``transport.host`` (on loopback: 127.0.0.1), and nowhere else:

* ``host_store``: the store's server is handed a socket already bound to ``host`` and listening
  (``TCPStore(master_listen_fd=...)``); members connect as before. The weight group's store
  (``weights``) and the trainer ranks' rendezvous (``init_trainer_group``) are built by it.
* ``gloo_device``: a gloo device bound to ``host`` where this machine holds that address (a member on
  another node keeps gloo's default device: the run's host is not one of its addresses).
* ``init_trainer_group``: the trainer ranks' default process group, initialised on a ``host_store``
  before DeepSpeed's ``init_distributed`` (which then finds the group initialised and uses it). gloo
  takes its device for a default group only from ``GLOO_SOCKET_IFNAME``, so it is set to the interface
  that holds ``host`` unless the user set it.

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
from datetime import timedelta

import psutil
import torch.distributed as dist

logger = logging.getLogger(__name__)

# Connections the store's listening socket queues before it accepts them: every rank of a large job
# may connect at once (torch's own store backlog is of this order).
LISTEN_BACKLOG = 2048
GLOO_INTERFACE_ENV = "GLOO_SOCKET_IFNAME"


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
    """A ``TCPStore`` whose server (``is_master``) listens on ``host:port`` only; a client connects to it."""
    if not is_master:
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


def gloo_device(host: str) -> dist.ProcessGroupGloo.Device:
    """A gloo device that listens on ``host`` where this machine holds it, else gloo's default device."""
    if holds_address(host):
        return dist.ProcessGroupGloo.create_device(hostname=host)
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
        interface = interface_of(host)
        if interface is not None:
            os.environ[GLOO_INTERFACE_ENV] = interface
        else:
            logger.warning(
                "no interface of this machine holds %s: gloo listens where the host name resolves", host
            )
    store = host_store(host, port, world_size, is_master=rank == 0, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
