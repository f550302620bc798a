"""Transport over real ZeroMQ tcp sockets on 127.0.0.1: round trips, backpressure, garbage, taken ports."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import time
from collections.abc import Iterator

import msgspec
import numpy as np
import pytest
import zmq

from pipelinerl.platform.transport import (
    PortInUseError,
    Receiver,
    Sender,
    check_bindable,
    create_curve_keys,
    run_keys,
)
from pipelinerl.platform.wire import (
    Envelope,
    Message,
    Rollout,
    Shutdown,
    TrainBatch,
    TrainSequence,
    WeightUpdate,
    encode,
    encode_numbered,
)
from tests.conftest import non_loopback_ipv4

ANY_PORT = "tcp://127.0.0.1:*"  # ZeroMQ picks a free port; the socket's .address says which


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def make_rollout(index: int = 0, n_completion: int = 3) -> Rollout:
    return Rollout(
        rollout_id=f"{index:032x}",
        run_id="run",
        group_id="g",
        group_size=2,
        problem_id="p",
        split="train",
        actor_id=0,
        prompt_token_ids=np.arange(5, dtype=np.int32),
        completion_token_ids=np.arange(n_completion, dtype=np.int32),
        behaviour_logprobs=np.full(n_completion, -0.5, dtype=np.float32),
        token_versions=np.zeros(n_completion, dtype=np.int32),
        finished=True,
        completion_text=f"answer {index} ✓",
        created_at=1_700_000_000.0 + index,
    )


def make_batch() -> TrainBatch:
    sequence = TrainSequence(
        rollout_id="r",
        group_id="g",
        prompt_token_ids=np.arange(4, dtype=np.int32),
        completion_token_ids=np.arange(2, dtype=np.int32),
        behaviour_logprobs=np.array([-1.0, -2.0], dtype=np.float32),
        token_versions=np.array([1, 2], dtype=np.int32),
        reward=1.0,
        advantage=0.5,
        finished=True,
    )
    return TrainBatch(batch_index=0, sequences=[sequence, sequence], micro_batches=[[0], [1]], created_at=1.0)


def free_tcp_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


def test_push_pull_round_trip(context: zmq.Context) -> None:
    with (
        Receiver(context, ANY_PORT, "pull", bind=True) as receiver,
        Sender(context, receiver.address, "push", bind=False) as sender,
    ):
        assert receiver.address.startswith("tcp://127.0.0.1:") and not receiver.address.endswith("*")
        messages: list[Message] = [
            make_rollout(0),
            make_rollout(1, n_completion=0),
            make_batch(),
            Shutdown(reason="done"),
        ]
        for message in messages:
            assert sender.send(message, timeout_s=5.0)
        received = [receiver.recv(timeout_s=5.0) for _ in messages]
        assert received == messages
        assert receiver.received_count == 4
        assert receiver.malformed_count == 0
        assert sender.sent_count == 4


def test_push_binds_and_pull_connects(context: zmq.Context) -> None:
    with (
        Sender(context, ANY_PORT, "push", bind=True) as sender,
        Receiver(context, sender.address, "pull", bind=False) as receiver,
    ):
        assert sender.send(make_rollout(7), timeout_s=5.0)
        assert receiver.recv(timeout_s=5.0) == make_rollout(7)


def test_pub_sub_round_trip_after_the_slow_joiner(context: zmq.Context) -> None:
    update = WeightUpdate(
        policy_version=3,
        parameter_names=["w"],
        parameter_shapes=[[2, 2]],
        parameter_dtypes=["float32"],
        samples_trained=64,
        created_at=1.0,
    )
    with (
        Sender(context, ANY_PORT, "pub", bind=True) as publisher,
        Receiver(context, publisher.address, "sub", bind=False) as subscriber,
    ):
        received = None
        deadline = time.monotonic() + 10.0
        # A subscriber misses what is published before its subscription reaches the publisher.
        while received is None and time.monotonic() < deadline:
            assert publisher.send(update)
            received = subscriber.recv(timeout_s=0.05)
        assert received == update
        assert publisher.send(Shutdown(reason="bye"))
        assert subscriber.recv(timeout_s=5.0) == Shutdown(reason="bye")


def test_recv_returns_none_after_the_timeout(context: zmq.Context) -> None:
    with Receiver(context, ANY_PORT, "pull", bind=True) as receiver:
        started = time.monotonic()
        assert receiver.recv(timeout_s=0.2) is None
        assert time.monotonic() - started >= 0.19
        assert receiver.received_count == 0


def test_push_without_a_consumer_times_out(context: zmq.Context) -> None:
    # Connecting to a port nobody listens on: IMMEDIATE keeps the message in the sender.
    with Sender(context, free_tcp_address(), "push", bind=False, high_water_mark=2) as sender:
        started = time.monotonic()
        assert sender.send(Shutdown(reason="x"), timeout_s=0.2) is False
        assert 0.19 <= time.monotonic() - started < 5.0
        assert sender.sent_count == 0


def test_push_backpressure_bounds_the_queue_then_drains(context: zmq.Context) -> None:
    # 1 MiB messages, so kernel socket buffers hold only a few: the bound is the high-water marks.
    big = make_rollout(n_completion=256 * 1024)
    with (
        Receiver(context, ANY_PORT, "pull", bind=True, high_water_mark=2) as receiver,
        Sender(context, receiver.address, "push", bind=False, high_water_mark=2) as sender,
    ):
        accepted = 0
        while sender.send(big, timeout_s=0.2):
            accepted += 1
            assert accepted < 50, "the queue never filled: sends are not bounded"
        assert accepted >= 2
        started = time.monotonic()
        assert sender.send(big, timeout_s=0.2) is False
        assert 0.19 <= time.monotonic() - started < 5.0

        # The consumer catches up: every accepted message arrives, and sending works again.
        drained = 0
        while receiver.recv(timeout_s=1.0) is not None:
            drained += 1
        assert drained == accepted
        assert sender.send(Shutdown(reason="after drain"), timeout_s=5.0)
        assert receiver.recv(timeout_s=5.0) == Shutdown(reason="after drain")


def test_receiver_counts_and_skips_garbage_then_receives_a_good_message(
    context: zmq.Context, caplog: pytest.LogCaptureFixture
) -> None:
    good = make_rollout(3)
    envelope, *good_frames = [bytes(f) for f in encode_numbered(good, Envelope("test", 1))]
    garbage = [
        [b"\xc1\xc1\xc1"],  # not msgpack
        [b"hello", b"world"],  # not msgpack, two frames
        [envelope, msgspec.msgpack.encode({"type": "Pickle", "payload": "x"})],  # unknown tag
        [envelope, msgspec.msgpack.encode([1, 2, 3])],  # not a struct
        [envelope, *good_frames[:-1]],  # missing frame
        [envelope, *good_frames, b"\x00" * 4],  # extra frame
        [envelope, *good_frames[:2], good_frames[2][:-1], *good_frames[3:]],  # wrong buffer size
        good_frames,  # no envelope
        [msgspec.msgpack.encode(["test", 0]), *good_frames],  # numbers start at 1
    ]
    with Receiver(context, ANY_PORT, "pull", bind=True) as receiver:
        raw_push = context.socket(zmq.PUSH)
        raw_push.setsockopt(zmq.SNDTIMEO, 5000)  # a send that cannot complete fails, never hangs
        try:
            raw_push.connect(receiver.address)
            for frames in garbage:
                raw_push.send_multipart(frames)
            raw_push.send_multipart([envelope, *good_frames])
            with caplog.at_level(logging.WARNING, logger="pipelinerl.platform.transport"):
                assert receiver.recv(timeout_s=5.0) == good
        finally:
            raw_push.close(linger=0)
        assert receiver.malformed_count == len(garbage)
        assert receiver.received_count == 1
        warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
        assert len(warnings) == len(garbage)
        assert "1 frame(s)" in warnings[0] and "bad envelope" in warnings[1]
        assert "Invalid value 'Pickle'" in warnings[2]
        assert "missing frame" in warnings[4]
        assert "extra frame" in warnings[5]
        assert "bad envelope" in warnings[7] and "bad envelope" in warnings[8]
        assert receiver.address in warnings[0]


def test_recv_timeout_holds_while_only_garbage_arrives(context: zmq.Context) -> None:
    with Receiver(context, ANY_PORT, "pull", bind=True) as receiver:
        raw_push = context.socket(zmq.PUSH)
        raw_push.setsockopt(zmq.SNDTIMEO, 5000)  # a send that cannot complete fails, never hangs
        try:
            raw_push.connect(receiver.address)
            raw_push.send_multipart([b"junk"])
            assert receiver.recv(timeout_s=0.5) is None
        finally:
            raw_push.close(linger=0)
        assert receiver.malformed_count == 1


def test_binding_a_taken_port_raises_port_in_use(context: zmq.Context) -> None:
    with Receiver(context, ANY_PORT, "pull", bind=True) as holder:
        with pytest.raises(PortInUseError) as raised:
            Sender(context, holder.address, "push", bind=True, setting="transport.rollout_port")
        assert holder.address in str(raised.value)
        assert "`transport.rollout_port`" in str(raised.value)
        with pytest.raises(PortInUseError, match="already in use"):
            Receiver(context, holder.address, "sub", bind=True)


def test_check_bindable_detects_a_taken_port(context: zmq.Context) -> None:
    with Receiver(context, ANY_PORT, "pull", bind=True) as holder:
        with pytest.raises(PortInUseError, match="transport.rollout_port") as raised:
            check_bindable(holder.address, setting="transport.rollout_port")
        assert holder.address in str(raised.value)
    # Free again once the holder closed (ZeroMQ's I/O thread closes the listener a moment later).
    deadline = time.monotonic() + 5.0
    while True:
        try:
            check_bindable(holder.address)
            break
        except PortInUseError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def test_check_bindable_detects_a_port_held_by_another_program() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(PortInUseError, match="Change the port of this address in the run config"):
            check_bindable(address)


def test_check_bindable_accepts_free_wildcard_and_non_tcp_addresses() -> None:
    check_bindable(free_tcp_address())
    check_bindable("tcp://127.0.0.1:*")
    check_bindable("tcp://127.0.0.1:0")
    check_bindable("ipc:///tmp/pipelinerl-test.sock")
    with pytest.raises(ValueError, match="expected tcp://HOST:PORT"):
        check_bindable("tcp://127.0.0.1:notaport")
    with pytest.raises(ValueError, match="expected tcp://HOST:PORT"):
        check_bindable("tcp://127.0.0.1")


def test_bad_arguments_are_refused(context: zmq.Context) -> None:
    with pytest.raises(ValueError, match="'push', 'pub' or 'xpub'"):
        Sender(context, ANY_PORT, "pull", bind=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'pull' or 'sub'"):
        Receiver(context, ANY_PORT, "push", bind=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="high_water_mark must be >= 1"):
        Receiver(context, ANY_PORT, "pull", bind=True, high_water_mark=0)


def test_close_is_idempotent(context: zmq.Context) -> None:
    sender = Sender(context, ANY_PORT, "pub", bind=True)
    sender.close()
    sender.close()
    assert sender.socket.closed


# --- CurveZMQ: what every run uses, on loopback too ---


def test_curve_keys_are_written_once_with_private_secrets(tmp_path) -> None:
    directory = create_curve_keys(tmp_path)
    secret = directory / "client.key_secret"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "allowed").stat().st_mode) == 0o700
    for path in [*directory.iterdir(), *(directory / "allowed").iterdir()]:
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    before = secret.read_bytes()
    create_curve_keys(tmp_path)
    assert secret.read_bytes() == before, "a restart keeps the run's keys"
    keys = run_keys(tmp_path)
    assert keys.server_public != keys.client_public
    with pytest.raises(ValueError, match="need its CurveZMQ keys in .*elsewhere"):
        run_keys(tmp_path / "elsewhere")
    os.chmod(secret, 0o644)
    with pytest.raises(ValueError, match="mode 644: other users could read"):
        run_keys(tmp_path)


@pytest.mark.parametrize("kind", ["push-pull", "pub-sub"])
def test_curve_round_trip_on_a_non_loopback_address(context: zmq.Context, tmp_path, kind: str) -> None:
    host = non_loopback_ipv4()
    if host is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    keys = run_keys(create_curve_keys(tmp_path).parent)
    if kind == "push-pull":
        server = Receiver(context, f"tcp://{host}:*", "pull", bind=True, keys=keys)
        client = Sender(context, server.address, "push", bind=False, keys=keys)
    else:
        server = Sender(context, f"tcp://{host}:*", "pub", bind=True, keys=keys)  # type: ignore[assignment]
        client = Receiver(context, server.address, "sub", bind=False, keys=keys)  # type: ignore[assignment]
    receiver = server if isinstance(server, Receiver) else client
    sender = client if isinstance(client, Sender) else server
    with server, client:
        deadline = time.monotonic() + 10
        received = None
        while received is None and time.monotonic() < deadline:  # PUB drops until SUB has joined
            assert sender.send(make_rollout(7), timeout_s=5)
            received = receiver.recv(timeout_s=0.2)
        assert isinstance(received, Rollout) and received.rollout_id == make_rollout(7).rollout_id


def test_a_peer_without_the_run_keys_is_refused(context: zmq.Context, tmp_path) -> None:
    keys = run_keys(create_curve_keys(tmp_path / "run").parent)
    strangers = run_keys(create_curve_keys(tmp_path / "other").parent)
    # The stranger knows the server's public key (it is not secret) but has its own client key.
    impostor = type(keys)(
        keys.server_public,
        keys.server_secret,
        strangers.client_public,
        strangers.client_secret,
        keys.allowed_dir,
    )
    with Receiver(context, ANY_PORT, "pull", bind=True, keys=keys) as receiver:
        plain = context.socket(zmq.PUSH)
        plain.setsockopt(zmq.LINGER, 0)
        plain.connect(receiver.address)
        # Its attempt may be refused before or during the send (the pipe closes when the server
        # rejects the handshake): both are a refusal.
        with contextlib.suppress(zmq.Again):
            if plain.poll(500, zmq.POLLOUT):
                plain.send_multipart(encode(make_rollout(1)), flags=zmq.NOBLOCK)
        with Sender(context, receiver.address, "push", bind=False, keys=impostor) as intruder:
            sent = intruder.send(make_rollout(2), timeout_s=1.0)
            assert receiver.recv(timeout_s=1.5) is None, "nothing from a peer without the run's keys"
        plain.close()
        assert receiver.malformed_count == 0
        # Both refusals are counted where they happened: the keyless peer's and the impostor's.
        assert receiver.unauthenticated_count >= 2, receiver.unauthenticated_count
        assert receiver.peer_disconnects == 0, "a refused handshake is not also a dropped connection"
        with Sender(context, receiver.address, "push", bind=False, keys=keys) as member:
            assert member.send(make_rollout(3), timeout_s=5)
            received = receiver.recv(timeout_s=5)
        assert isinstance(received, Rollout) and received.rollout_id == make_rollout(3).rollout_id
    assert sent is False, "the refused handshake never completes, so the intruder's message stays queued"


def test_an_xpub_counts_its_subscribers_in_and_out(context: zmq.Context, tmp_path) -> None:
    """The trainer's notices socket sees each stage's subscription arrive (and leave), so a first
    notice waits for the slow joiner instead of being dropped before its subscription arrived."""
    keys = run_keys(create_curve_keys(tmp_path).parent)
    with Sender(context, ANY_PORT, "xpub", bind=True, keys=keys) as notices:
        assert notices.subscribers() == 0
        assert not notices.wait_for_subscribers(1, timeout_s=0.2), "nobody there yet"
        first = Receiver(context, notices.address, "sub", bind=False, keys=keys)
        second = Receiver(context, notices.address, "sub", bind=False, keys=keys)
        assert notices.wait_for_subscribers(2, timeout_s=30)
        notices.send(Shutdown(reason="a first notice"))
        assert isinstance(first.recv(timeout_s=30), Shutdown) and isinstance(
            second.recv(timeout_s=30), Shutdown
        )
        second.close()
        deadline = time.monotonic() + 30
        while notices.subscribers() != 1:
            assert time.monotonic() < deadline, "the closed subscriber was never counted out"
            time.sleep(0.01)
        first.close()
    with Sender(context, ANY_PORT, "push", bind=True) as push, pytest.raises(ValueError, match="xpub"):
        push.subscribers()
