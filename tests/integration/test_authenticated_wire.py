"""The authenticated wire (issue 24): every run's peers authenticate, on loopback too; the actors'
streams are pinned by their real names and their losses counted; the torch.distributed stores listen
on ``transport.host`` only.

Socket-level tests build the preprocessor's rollout socket and the actor's with the stages' own
construction functions (``preprocessor.rollout_receiver``, ``actor.rollout_sender``) over real
ZeroMQ. What happened is read from the sockets' counters, never from timings. The live checks (a
keyless stranger refused and counted at a run's rollout socket, none of its frames decoded, the
actor's rollouts all counted as its own, every stage listening on 127.0.0.1 only, the run directory
private) are made on the live run of ``test_reward_hacking.py``, a loopback run that carries them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
import zmq

from pipelinerl.bench.fault_frames import numbered, stranger_rollout
from pipelinerl.platform.config import PipelineConfig, load_config
from pipelinerl.platform.curve_keys import (
    CurveKeys,
    create_curve_keys,
    release_authentication,
    run_keys,
    serve_with_keys,
)
from pipelinerl.platform.stores import holds_address, host_store, interface_of
from pipelinerl.platform.transport import Receiver, Sender
from pipelinerl.platform.weights import WeightGroup
from pipelinerl.platform.wire import Envelope, Rollout, encode_numbered
from pipelinerl.workers.actor import rollout_sender
from pipelinerl.workers.preprocessor import rollout_receiver
from tests.conftest import free_port, wait_until
from tests.stranger import GARBAGE, send_as_stranger

LOOPBACK = "127.0.0.1"
# The greeting of a ZMTP 3.0 peer offering the NULL mechanism (no keys): a CURVE server refuses it.
ZMTP_NULL_GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" * 32


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def keys(tmp_path: Path) -> CurveKeys:
    return run_keys(create_curve_keys(tmp_path).parent)


def run_config(*overrides: str) -> PipelineConfig:
    """A loopback run's config; its rollout port (base_port + 0) is one the kernel just found free."""
    return load_config(None, [f"transport.base_port={free_port()}", *overrides])


def rollouts(count: int, first: int = 0) -> list[Rollout]:
    return [stranger_rollout(first + index, run_id="run") for index in range(count)]


def drain(receiver: Receiver, timeout_s: float = 2.0) -> list[Rollout]:
    received = []
    while (message := receiver.recv(timeout_s=timeout_s)) is not None:
        assert isinstance(message, Rollout)
        received.append(message)
    return received


# ----- the actors' streams, pinned by their real names ---------------------------------------------


def test_real_actor_messages_lost_on_the_way_are_counted_as_lost_from_the_actors(context, keys) -> None:
    """Actor 0's real sender numbers messages 1..9; 3..7 never reach the preprocessor's real receiver
    (numbered, then skipped: what a message lost on the way looks like). Before the fix the preprocessor
    pinned the literal name ``actor0`` while the actor sends as ``actor0/<pid>/<hex>``, so these five
    counted in ``lost`` and never in ``lost_from_actors``."""
    config = run_config("actor.num_actors=2")
    with (
        rollout_receiver(context, config, keys) as preprocessor,
        rollout_sender(context, config, 0, keys) as actor,
    ):
        messages = rollouts(9)
        for message in messages[:2]:
            assert actor.send(message, timeout_s=30)
        actor.sent_count += 5  # messages 3..7 were numbered and never arrived
        for message in messages[7:]:
            assert actor.send(message, timeout_s=30)
        received = drain(preprocessor)
    assert [m.rollout_id for m in received] == [m.rollout_id for m in messages[:2] + messages[7:]]
    assert actor.stream.startswith("actor0/")
    assert (preprocessor.lost_count, preprocessor.senders_lost_count) == (5, 5)
    assert preprocessor.senders_received_count == preprocessor.received_count == 4


def test_messages_a_key_holder_takes_from_an_actor_are_all_counted_as_lost_from_the_actors(
    context, keys
) -> None:
    """A peer with the run's keys binds a PULL of its own that the actor's socket also reaches: the PUSH
    deals messages to both in turn. Every message it took is a gap in the actor's stream at the
    preprocessor, counted in ``lost_from_actors``, to the message."""
    config = run_config()
    thief = context.socket(zmq.PULL)
    thief.setsockopt(zmq.LINGER, 0)
    serve_with_keys(thief, keys)
    thief.bind(f"tcp://{LOOPBACK}:*")
    thief_address = thief.getsockopt_string(zmq.LAST_ENDPOINT)
    preprocessor = rollout_receiver(context, config, keys)
    actor = rollout_sender(context, config, 0, keys)
    handshakes = thief.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        actor.socket.connect(thief_address)
        # The PUSH deals to a peer only once its handshake is done: wait for the thief's (on a loaded
        # machine the 40 messages below could otherwise all be dealt before it).
        assert handshakes.poll(30_000), "the actor's socket never finished its handshake with the thief"
        messages = rollouts(400)
        received: list[Rollout] = []
        taken = sent = 0

        def arrived() -> bool:  # every message sent has arrived at one peer or the other
            nonlocal taken
            while thief.poll(50):
                thief.recv_multipart()
                taken += 1
            received.extend(drain(preprocessor, timeout_s=0.05))
            return len(received) + taken >= sent

        def arrivals() -> None:
            wait_until(arrived, 60, f"the {sent} messages sent, at the thief or the stage", interval_s=0)

        for message in messages[:40]:
            assert actor.send(message, timeout_s=30)
            sent += 1
        arrivals()
        # A loss shows as a gap once a later message arrives: send on until the thief has taken one (the
        # client's side of its handshake may end a little after the thief's) and one reaches the stage.
        while taken == 0 or not received or received[-1].rollout_id != messages[sent - 1].rollout_id:
            assert sent < len(messages), f"{sent} messages sent: the thief took {taken}"
            assert actor.send(messages[sent], timeout_s=30)
            sent += 1
            arrivals()
    finally:
        actor.close()
        preprocessor.close()
        thief.disable_monitor()
        handshakes.close(linger=0)
        thief.close(linger=0)
        release_authentication(context)
    assert taken >= 1, "the PUSH dealt the second peer nothing"
    assert len(received) + taken == sent
    assert preprocessor.senders_lost_count == preprocessor.lost_count == taken


def test_a_restarted_actor_stays_pinned_and_its_numbers_from_one_are_no_replay(context, keys) -> None:
    config = run_config()
    with rollout_receiver(context, config, keys) as preprocessor:
        with rollout_sender(context, config, 0, keys) as first:
            for message in rollouts(5):
                assert first.send(message, timeout_s=30)
            assert len(drain(preprocessor)) == 5
        with rollout_sender(context, config, 0, keys) as restarted:  # a new incarnation: a new stream
            assert restarted.stream != first.stream
            for message in rollouts(5, first=5):
                assert restarted.send(message, timeout_s=30)
            assert len(drain(preprocessor)) == 5
        assert preprocessor.rejected_count == 0 and preprocessor.lost_count == 0
        assert preprocessor.senders_received_count == 10
        assert sorted(preprocessor.numbers.pinned_streams()) == sorted([first.stream, restarted.stream])


# ----- strangers on loopback ------------------------------------------------------------------------


def test_a_keyless_stranger_on_loopback_is_refused_and_counted(context, keys) -> None:
    """On loopback too: before, ``run_keys`` gave no keys on loopback and the stranger's garbage
    reached the preprocessor's decoder."""
    config = run_config()
    with rollout_receiver(context, config, keys) as preprocessor:
        delivery = send_as_stranger(preprocessor.address, GARBAGE, handshake_timeout_s=30)
        assert delivery.handshake == "refused", delivery
        assert preprocessor.recv(timeout_s=1.0) is None
        assert preprocessor.malformed_count == 0 and preprocessor.received_count == 0
        assert preprocessor.unauthenticated_count >= 1
        # A holder of the run's keys is admitted: the same frames reach the decoder and are refused there.
        insider = send_as_stranger(preprocessor.address, GARBAGE, handshake_timeout_s=30, keys=keys)
        assert (insider.handshake, insider.sent) == ("accepted", len(GARBAGE)), insider
        assert drain(preprocessor) == []
        assert preprocessor.malformed_count == len(GARBAGE)


def test_a_stranger_can_neither_evict_an_actor_stream_nor_forge_its_numbers(context, keys) -> None:
    """The attack of issue 24: 2,000 invented stream names to push the actor's stream out of the
    bounded table, then one message under the actor's own stream name with a huge number, so that
    every later rollout of the actor would be a replay. Refused at the handshake, it changes nothing."""
    config = run_config()
    with (
        rollout_receiver(context, config, keys) as preprocessor,
        rollout_sender(context, config, 0, keys) as actor,
    ):
        messages = rollouts(10)
        for message in messages[:5]:
            assert actor.send(message, timeout_s=30)
        assert len(drain(preprocessor)) == 5
        flood = [numbered(stranger_rollout(index), 7, f"invented-{index}") for index in range(2000)]
        forged = [encode_numbered(stranger_rollout(9999, run_id="run"), Envelope(actor.stream, 2**62))]
        # Refused, its socket has no peer: each send gives up at once (the frames never leave it).
        delivery = send_as_stranger(
            preprocessor.address, flood + forged, handshake_timeout_s=30, send_timeout_s=0.001
        )
        assert delivery.handshake == "refused", delivery
        for message in messages[5:]:
            assert actor.send(message, timeout_s=30)
        received = drain(preprocessor)
    assert [m.rollout_id for m in received] == [m.rollout_id for m in messages[5:]]
    assert preprocessor.rejected_count == 0 and preprocessor.lost_count == 0
    assert preprocessor.unauthenticated_count >= 1


def test_a_key_holders_flood_of_invented_streams_cannot_evict_the_actor_stream(context, keys) -> None:
    """Even a peer holding the run's keys (the decoder's adversary in the flood benchmark) cannot push
    the actor's stream out: it is pinned by its sender name, apart from the bounded table."""
    config = run_config()
    with (
        rollout_receiver(context, config, keys) as preprocessor,
        rollout_sender(context, config, 0, keys) as actor,
    ):
        messages = rollouts(6)
        for message in messages[:3]:
            assert actor.send(message, timeout_s=30)
        flood = [numbered(stranger_rollout(index), 7, f"invented-{index}") for index in range(2000)]
        outcome: dict = {}
        sending = threading.Thread(  # while this thread reads, as the preprocessor does
            target=lambda: outcome.update(
                delivery=send_as_stranger(
                    preprocessor.address, flood, handshake_timeout_s=30, send_timeout_s=30, keys=keys
                )
            )
        )
        sending.start()
        read = 0
        while read < 2003:  # the actor's three and the flood
            assert preprocessor.recv(timeout_s=60) is not None, read
            read += 1
        sending.join(timeout=60)
        assert outcome["delivery"].handshake == "accepted" and outcome["delivery"].sent == 2000
        for message in messages[3:]:
            assert actor.send(message, timeout_s=30)
        assert [m.rollout_id for m in drain(preprocessor)] == [m.rollout_id for m in messages[3:]]
    assert preprocessor.senders_received_count == 6 and preprocessor.senders_lost_count == 0
    assert preprocessor.rejected_count == 0


def test_a_stage_with_other_keys_is_refused_by_the_authenticator_and_counted(context, keys, tmp_path) -> None:
    """A peer that knows the server's public key but holds a client key of another run: the ZAP
    handler refuses it (``EVENT_HANDSHAKE_FAILED_AUTH``), counted as unauthenticated."""
    other = run_keys(create_curve_keys(tmp_path / "other").parent)
    impostor = CurveKeys(
        keys.server_public, keys.server_secret, other.client_public, other.client_secret, keys.allowed_dir
    )
    with Receiver(context, f"tcp://{LOOPBACK}:*", "pull", bind=True, keys=keys) as receiver:
        with Sender(context, receiver.address, "push", bind=False, keys=impostor, name="actor0") as sender:
            assert sender.send(stranger_rollout(1), timeout_s=1.0) is False
        assert receiver.recv(timeout_s=0.5) is None
        assert receiver.unauthenticated_count >= 1


CONNECTIONS = 3000  # each refused connection is two monitor events; libzmq blocks at about 1,000 unread

# The stage's side, in a process of its own: a stalled ZeroMQ I/O thread can freeze the whole process
# (a socket call waiting for it while holding the GIL), which the test must see as a failure, not share.
STAGE_UNDER_CONNECTIONS = """
import socket, sys
import zmq
from pathlib import Path
from pipelinerl.platform.config import load_config
from pipelinerl.platform.curve_keys import run_keys
from pipelinerl.platform.transport import Receiver, Sender
from pipelinerl.platform.wire import Shutdown
from pipelinerl.workers.preprocessor import rollout_receiver

keys, connections = run_keys(Path(sys.argv[1])), int(sys.argv[3])
context = zmq.Context()
config = load_config(None, [f"transport.base_port={sys.argv[2]}"])
preprocessor = rollout_receiver(context, config, keys)
trainer = Sender(context, "tcp://127.0.0.1:*", "pub", bind=True, keys=keys, name="trainer")
notices = Receiver(context, trainer.address, "sub", bind=False, keys=keys)
while notices.recv(timeout_s=0.1) is None:  # the subscriber has joined
    trainer.send(Shutdown(reason="hello"))
host, port = preprocessor.address.removeprefix("tcp://").rsplit(":", 1)
greeting = sys.stdin.buffer.read()
for refused in range(connections):  # keyless ZMTP peers: each is refused in the handshake
    with socket.create_connection((host, int(port)), timeout=30) as peer:
        peer.sendall(greeting)
        try:
            while peer.recv(4096):  # until ZeroMQ closes the connection
                pass
        except TimeoutError:
            sys.exit(f"ZeroMQ stopped answering after {refused} refused connections")
        except OSError:
            pass  # reset by ZeroMQ: refused as well
trainer.send(Shutdown(reason="after the flood"))
while (received := notices.recv(timeout_s=30)) == Shutdown(reason="hello"):
    pass
if received != Shutdown(reason="after the flood"):
    sys.exit(f"the notice never came after the connections: {received!r}")
print(preprocessor.unauthenticated_count, preprocessor.peer_disconnects)
for sock in (preprocessor, trainer, notices):
    sock.close()
context.term()
"""


def test_thousands_of_refused_connections_never_stall_the_stage_reading_another_socket(tmp_path) -> None:
    """The preprocessor waits on its notice socket while a local process opens connection after
    connection to its rollout socket. Each refusal is an event on that socket's monitor; read only in
    ``recv`` (before: the rollout socket's), unread events blocked ZeroMQ's I/O thread after about a
    thousand, and with it the notices the stage was waiting for: the run stalled (here the process
    froze). Read on a thread of their own, they are counted and the notices keep coming."""
    create_curve_keys(tmp_path)
    stage = subprocess.Popen(
        [sys.executable, "-c", STAGE_UNDER_CONNECTIONS, str(tmp_path), str(free_port()), str(CONNECTIONS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = stage.communicate(ZMTP_NULL_GREETING, timeout=240)
    except subprocess.TimeoutExpired:
        stage.kill()
        stage.communicate()
        pytest.fail(f"the stage froze under {CONNECTIONS} refused connections")
    assert stage.returncode == 0, err.decode(errors="replace")[-3000:]
    unauthenticated, disconnects = map(int, out.split())
    assert unauthenticated + disconnects >= CONNECTIONS // 2, (unauthenticated, disconnects)


# ----- the torch.distributed stores listen on the run's host only ------------------------------------


def listening(process: psutil.Process) -> set[tuple[str, int]]:
    return {
        (connection.laddr.ip, connection.laddr.port)
        for connection in process.net_connections("tcp")
        if connection.status == psutil.CONN_LISTEN
    }


def test_the_weight_groups_store_and_gloo_listen_on_the_host_only() -> None:
    """Rank 0 (the trainer's side) and one member (an actor's) in this process: every socket the group
    opened listens on 127.0.0.1. Before, the store's server listened on ``::`` (every interface)."""
    before = listening(psutil.Process())
    port = free_port()
    groups: dict[str, WeightGroup] = {}
    lead = threading.Thread(
        target=lambda: groups.update(lead=WeightGroup.lead(LOOPBACK, port, 2, timeout_s=60))
    )
    lead.start()
    groups["member"] = WeightGroup.join(LOOPBACK, port, 1, 2, timeout_s=60)
    lead.join(timeout=60)
    assert "lead" in groups, "rank 0 never formed the group"
    opened = listening(psutil.Process()) - before
    assert (LOOPBACK, port) in opened, opened
    assert len(opened) >= 2, f"the store and gloo's listeners: {opened}"
    assert {ip for ip, _ in opened} == {LOOPBACK}, opened


def test_a_store_names_a_taken_port_and_an_unknown_host() -> None:
    port = free_port()
    first = host_store(LOOPBACK, port, 2, is_master=True, timeout=timedelta(seconds=10))
    with pytest.raises(OSError, match=f"127.0.0.1:{port}: the port is already in use.*transport.base_port"):
        host_store(LOOPBACK, port, 2, is_master=True, timeout=timedelta(seconds=10))
    del first
    with pytest.raises(ValueError, match="'no-such-host.invalid' does not resolve"):
        host_store("no-such-host.invalid", port, 2, is_master=True, timeout=timedelta(seconds=10))
    assert holds_address(LOOPBACK) and not holds_address("198.51.100.7")  # TEST-NET-2: nobody's
    loopback = interface_of(LOOPBACK)
    assert loopback is not None and LOOPBACK in {
        entry.address for entry in psutil.net_if_addrs()[loopback]
    }
    assert interface_of("198.51.100.7") is None


TRAINER_RANK = """
import json, sys
from datetime import timedelta
import psutil
import torch.distributed as dist
from pipelinerl.platform.stores import init_trainer_group
rank, port = int(sys.argv[1]), int(sys.argv[2])
before = {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections("tcp") if c.status == "LISTEN"}
init_trainer_group("gloo", "127.0.0.1", port, rank, 2, timedelta(seconds=60))
dist.barrier()
after = {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections("tcp") if c.status == "LISTEN"}
print(json.dumps(sorted(after - before)))
dist.barrier()
dist.destroy_process_group()
"""


def test_the_trainer_ranks_rendezvous_and_gloo_listen_on_the_host_only() -> None:
    """Two real trainer-rank processes form their default group as the trainer does: the rendezvous
    store (rank 0) and gloo's sockets listen on 127.0.0.1 only. (``env://``, as before, had rank 0's
    store listen on every interface, and gloo where the host name resolves.)"""
    port = free_port()
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", TRAINER_RANK, str(rank), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [rank.communicate(timeout=180) for rank in ranks]
    for rank, (_, err) in zip(ranks, outputs, strict=True):
        assert rank.returncode == 0, err[-3000:]
    opened = [set(map(tuple, json.loads(out.strip().splitlines()[-1]))) for out, _ in outputs]
    assert (LOOPBACK, port) in opened[0], opened
    assert all(opened), f"each rank listens for gloo: {opened}"
    assert {ip for ranks_opened in opened for ip, _ in ranks_opened} == {LOOPBACK}, opened
