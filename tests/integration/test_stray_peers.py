"""Stray peers on a run's ports: a plain TCP client takes no message; a ZeroMQ one that takes a
batch makes the trainer's inbox fail at once, naming the gap; a live run hammered on every port it
binds loses nothing and finishes."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest
import zmq

from pipelinerl.platform.transport import MessagesLost, Receiver, Sender
from pipelinerl.platform.wire import Shutdown
from tests.conftest import worker_port

# A ZMTP 3.0 greeting's first bytes: a client that gets that far looks like a ZeroMQ peer for a while.
ZMTP_SIGNATURE = b"\xff" + b"\x00" * 8 + b"\x7f"


@dataclass
class Hammer:
    """Plain TCP clients connecting over and over to ``addresses`` and writing junk, until stopped."""

    addresses: list[str]
    seed: int = 0
    connections: int = 0
    refused: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        rng = random.Random(self.seed)
        while not self.stop.is_set():
            for address in self.addresses:
                parts = urlsplit(address)
                try:
                    with socket.create_connection((parts.hostname, parts.port), timeout=1.0) as client:
                        self.connections += 1
                        junk = rng.choice([b"hello\r\n", ZMTP_SIGNATURE, b"", b"GET / HTTP/1.1\r\n\r\n"])
                        client.sendall(junk + rng.randbytes(rng.randint(0, 512)))
                        time.sleep(rng.random() * 0.02)  # some linger while messages are being sent
                except OSError:
                    self.refused += 1  # a port not bound yet, or a connection the peer dropped


@pytest.fixture
def hammer_of() -> Iterator[type[Hammer]]:
    threads: list[tuple[Hammer, threading.Thread]] = []

    def start(addresses: list[str], seed: int = 0) -> Hammer:
        hammer = Hammer(addresses, seed)
        thread = threading.Thread(target=hammer.run, daemon=True)
        thread.start()
        threads.append((hammer, thread))
        return hammer

    yield start  # type: ignore[misc]
    for hammer, thread in threads:
        hammer.stop.set()
        thread.join(timeout=10)


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def test_plain_tcp_clients_on_a_bound_push_take_no_message(context, hammer_of) -> None:
    """The preprocessor's inbox towards a trainer rank: bound PUSH, one message queued at a time. Before
    ZAP on bound sockets, libzmq took a plain TCP client for a ZMTP 1.0 peer and dealt it every other
    message (5 of 10 lost in a first try)."""
    address = f"tcp://127.0.0.1:{worker_port(27900)}"
    with (
        Sender(context, address, "push", bind=True, high_water_mark=1, name="preprocessor-to-rank0") as inbox,
        Receiver(context, address, "pull", bind=False, high_water_mark=1, on_gap="fail") as trainer,
    ):
        parts = urlsplit(address)
        held = [socket.create_connection((parts.hostname, parts.port), timeout=5) for _ in range(4)]
        for junk, client in zip(
            [b"hello\r\n", b"\x00\x05hello", b"x" * 100, ZMTP_SIGNATURE], held, strict=True
        ):
            client.sendall(junk)
        time.sleep(0.5)  # the held clients are peers of the PUSH by now, if it takes them for some
        hammer = hammer_of([address] * 4)
        received = []
        for index in range(300):
            time.sleep(0.005)  # the hammer's clients come and go meanwhile
            assert inbox.send(Shutdown(reason=str(index)), timeout_s=30), f"message {index} not accepted"
            message = trainer.recv(timeout_s=30)
            assert message is not None, f"message {index} never arrived"
            received.append(message.reason)
        hammer.stop.set()
        for client in held:
            client.close()
        assert received == [str(index) for index in range(300)]
        assert trainer.lost_count == 0 and trainer.malformed_count == 0
        assert hammer.connections > 20, hammer


def test_a_zeromq_peer_that_takes_a_batch_makes_the_inbox_fail_naming_the_gap(context) -> None:
    """A stray that speaks ZMTP 3 (it cannot be told from a stage on loopback) is dealt messages by the
    bound PUSH; the trainer's receiver sees the numbers skip and raises instead of waiting forever."""
    address = f"tcp://127.0.0.1:{worker_port(27901)}"
    with (
        Sender(context, address, "push", bind=True, high_water_mark=1, name="preprocessor-to-rank0") as inbox,
        Receiver(context, address, "pull", bind=False, high_water_mark=1, on_gap="fail") as trainer,
    ):
        stray = context.socket(zmq.PULL)
        stray.setsockopt(zmq.LINGER, 0)
        stray.connect(address)
        try:
            time.sleep(0.5)  # both peers connected: the PUSH deals to each in turn
            with pytest.raises(MessagesLost) as lost:
                for index in range(20):
                    assert inbox.send(Shutdown(reason=str(index)), timeout_s=10)
                    while trainer.recv(timeout_s=0.2) is not None:
                        pass
            taken = 0
            while stray.poll(500):
                stray.recv_multipart()
                taken += 1
        finally:
            stray.close(linger=0)
    assert taken >= 1
    text = str(lost.value)
    assert "never arrived" in text and "preprocessor-to-rank0/" in text and address in text, text
    assert trainer.lost_count >= 1


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_live_run_hammered_on_every_port_it_binds_loses_nothing_and_finishes(tmp_path, random_model_dir):
    """Plain TCP clients hammer the rollout PULL, the trainer inbox PUSH, the notice PUB and the
    weight group's store for the whole run: every batch reaches the trainer, no rollout is lost, and
    the run trains its steps on the actor's data."""
    import json

    from pipelinerl.launch.launcher import launch
    from pipelinerl.platform.config import load_config

    config = load_config(
        None,
        [
            f"model.path={random_model_dir}",
            f"run.output_dir={tmp_path}",
            f"run.home={tmp_path / 'home'}",
            "run.mode=pipeline",
            "run.max_steps=8",
            "run.stall_timeout_s=120",
            "rl.group_size=4",
            "rl.batch_size=16",
            "actor.max_in_flight=16",
            "task.eval_problems=16",
            f"transport.base_port={worker_port(27910)}",
        ],
    )
    addresses = config.transport.all_bound_addresses(config.trainer.num_processes)
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(result=launch(config, run_id="hammered")))
    thread.start()
    hammers = [Hammer(addresses, seed) for seed in range(3)]
    hammer_threads = [threading.Thread(target=h.run, daemon=True) for h in hammers]
    for hammer_thread in hammer_threads:
        hammer_thread.start()
    try:
        thread.join(timeout=480)
    finally:
        for hammer in hammers:
            hammer.stop.set()
        for hammer_thread in hammer_threads:
            hammer_thread.join(timeout=10)
    assert not thread.is_alive(), "the run did not finish"
    result = outcome["result"]
    assert result.summary["steps"] == 8 and result.summary["final_policy_version"] == 8, result.summary
    run_dir = tmp_path / "hammered"
    for log in ("preprocessor.log", "trainer0.log", "actor0.log"):
        assert "Traceback" not in (run_dir / "logs" / log).read_text(), log
    last = json.loads((run_dir / "preprocessor.jsonl").read_text().splitlines()[-1])
    assert last["preprocessor/lost"] == last["preprocessor/lost_from_actors"] == 0, last
    # The zero above can fail: every rollout received was counted as the actor's (its stream pinned).
    final = json.loads((run_dir / "preprocessor.final.json").read_text())
    assert final["preprocessor/received_from_actors"] == final["preprocessor/received"] >= 8 * 16, final
    assert sum(h.connections for h in hammers) > 100, [h.connections for h in hammers]
    trained = [rollout_id for record in result.records for rollout_id, _ in record["rollouts"]]
    assert len(trained) == 8 * 16 and len(set(trained)) == len(trained)
