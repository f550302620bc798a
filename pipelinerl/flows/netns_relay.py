"""A delaying, dropping Ethernet relay between two interfaces: latency and loss on one cluster link
where the kernel has no ``netem`` queueing discipline (this machine's: "Specified qdisc kind is
unknown").

``flows/netns_faults.impair_link`` moves a host's cable into a namespace of its own, between the
host and the bridge, and runs this relay there: every frame that arrives on one interface leaves by
the other ``delay_ms`` later, except a ``loss`` fraction of them, dropped at random (``seed``). It
works on whole Ethernet frames (raw ``AF_PACKET`` sockets), below IP, so TCP sees real delay and
real loss and retransmits as it would on a bad link. A frame read from a raw socket must be whole, so
the hosts' interfaces compute their checksums themselves (``tx_checksum_off``: the ethtool ioctl
``ETHTOOL_STXCSUM``, which also turns off segmentation offload, so no frame exceeds the MTU).

    python -m pipelinerl.flows.netns_relay IFACE_A IFACE_B --delay-ms 50 --loss 0.01
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import fcntl
import random
import socket
import threading
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
MAX_FRAME = 65536


SIOCETHTOOL = 0x8946
ETHTOOL_STXCSUM = 0x17


class _EthtoolValue(ctypes.Structure):
    _fields_ = [("cmd", ctypes.c_uint32), ("data", ctypes.c_uint32)]


class _InterfaceRequest(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 16), ("data", ctypes.c_void_p), ("pad", ctypes.c_char * 16)]


def tx_checksum_off(interface: str) -> None:
    """Make ``interface`` (in the calling thread's network namespace) send frames with their
    checksums computed (``ethtool -K IFACE tx off``, without the ethtool program). With segmentation
    offload limited to one segment (``gso_max_segs 1``), every frame is at most an MTU long."""
    value = _EthtoolValue(ETHTOOL_STXCSUM, 0)
    request = _InterfaceRequest(name=interface.encode(), data=ctypes.addressof(value))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        fcntl.ioctl(probe.fileno(), SIOCETHTOOL, request)


def open_raw(interface: str) -> socket.socket:
    raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    raw.bind((interface, 0))
    return raw


def forward(
    source: socket.socket, target: socket.socket, delay_s: float, loss: float, rng: random.Random
) -> None:
    """Frames from ``source`` to ``target`` after ``delay_s``, a ``loss`` fraction dropped; forever."""
    due: collections.deque[tuple[float, bytes]] = collections.deque()
    ready = threading.Condition()
    failures = [0]

    def sender() -> None:
        while True:
            with ready:
                while not due:
                    ready.wait()
                release, frame = due[0]
            wait = release - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            with ready:
                due.popleft()
            try:
                target.send(frame)
            except OSError as error:  # the far side is down (a cut cable): lost, as on a wire
                failures[0] += 1
                if failures[0] in (1, 10, 100, 1000):
                    print(f"{failures[0]} frame(s) could not be sent on: {error}", flush=True)

    threading.Thread(target=sender, daemon=True).start()
    while True:
        try:
            frame, address = source.recvfrom(MAX_FRAME)
        except OSError as error:  # the cable went down (ENETDOWN, once); frames come again once it is up
            print(f"receiving on {source.getsockname()[0]}: {error}", flush=True)
            time.sleep(0.01)
            continue
        if address[2] == PACKET_OUTGOING:  # our own sends, seen again
            continue
        if rng.random() < loss:
            continue
        with ready:
            due.append((time.monotonic() + delay_s, frame))
            ready.notify()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay in each direction")
    parser.add_argument("--loss", type=float, default=0.0, help="fraction of frames dropped, each direction")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not 0 <= args.loss < 1 or args.delay_ms < 0:
        parser.error(f"--loss {args.loss} must be in [0, 1) and --delay-ms {args.delay_ms} >= 0")
    first, second = open_raw(args.first), open_raw(args.second)
    rng = random.Random(args.seed)
    delay_s = args.delay_ms / 1000
    threading.Thread(
        target=forward, args=(first, second, delay_s, args.loss, random.Random(rng.random())), daemon=True
    ).start()
    print(
        f"relaying {args.first} <-> {args.second}: {args.delay_ms:g} ms each way, {args.loss:.2%} loss",
        flush=True,
    )
    forward(second, first, delay_s, args.loss, random.Random(rng.random()))


if __name__ == "__main__":
    main()
