"""Stray peers on a run's ports: a plain TCP client takes no message; a ZeroMQ one that takes a
batch makes the trainer's inbox fail at once, naming the gap; a live run hammered on every port it
binds loses nothing and finishes.

The live run is conventional, its rounds generated before they are trained, and ends inside a round,
so it also carries the actor's shutdown while it waits for weights (issue 15): the hammer's clients
never get past a handshake, so they neither carry nor block the trainer's Shutdown, and a run that
lost a message, or an actor the launcher had to kill, still fails its own check. One run for the
module; each test checks one property of it.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from pipelinerl.launch.launcher import launch
from pipelinerl.platform.config import load_config
from pipelinerl.platform.transport import MessagesLost, Receiver, Sender
from pipelinerl.platform.wire import Shutdown
from tests.conftest import wait_until, worker_port
from tests.integration.test_damaged_input import ACTOR_CLOSING_LINE

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
                    # A breath before the next: a refused connect takes microseconds, and three threads
                    # retrying at once would hold this process's GIL, starving the launcher beside them.
                    time.sleep(0.001)


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
        received: list[str] = []
        first = hammer.connections

        def one_more_passed() -> bool:
            """One more message through; enough once 300 passed while the hammer connected 20 times."""
            index = len(received)
            time.sleep(0.005)  # the hammer's clients come and go meanwhile
            assert inbox.send(Shutdown(reason=str(index)), timeout_s=30), f"message {index} not accepted"
            message = trainer.recv(timeout_s=30)
            assert isinstance(message, Shutdown), f"message {index} never arrived: {message!r}"
            received.append(message.reason)
            return len(received) >= 300 and hammer.connections - first > 20

        wait_until(one_more_passed, 300, "300 messages through while 20 clients came and went", interval_s=0)
        hammer.stop.set()
        for client in held:
            client.close()
        assert received == [str(index) for index in range(len(received))]
        assert trainer.lost_count == 0 and trainer.malformed_count == 0
        assert hammer.connections - first > 20, hammer


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
        monitor = stray.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        stray.connect(address)
        try:
            # Both peers connected (the stray's handshake done): the PUSH deals to each in turn.
            wait_until(
                lambda: (
                    monitor.poll(100)
                    and recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
                ),
                30,
                "the stray's handshake with the inbox",
                interval_s=0,
            )
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
            stray.disable_monitor()
            monitor.close(linger=0)
            stray.close(linger=0)
    assert taken >= 1
    text = str(lost.value)
    assert "never arrived" in text and "preprocessor-to-rank0/" in text and address in text, text
    assert trainer.lost_count >= 1


# ----- a live run, hammered ------------------------------------------------------------------------

# Odd, with rounds of two: the trainer takes the last step once the actor has generated the whole last
# round and waits for that round's weights, which never come (the run ends inside the round).
HAMMERED_STEPS = 7


@dataclass(frozen=True)
class HammeredRun:
    result: Any  # launcher.RunResult
    run_dir: Path
    hammers: list[Hammer]

    def log(self, name: str) -> str:
        return (self.run_dir / "logs" / name).read_text()


@pytest.fixture(scope="module")
def hammered(tmp_path_factory: pytest.TempPathFactory, random_model_dir: Path) -> HammeredRun:
    """Plain TCP clients hammer the rollout PULL, the trainer inbox PUSH, the notice PUB, the weight
    group's store and the trainer ranks' store for the whole run: a conventional run of rounds of two
    steps, generated before they are trained (``train_during_round=false``), ending inside a round."""
    tmp_path = tmp_path_factory.mktemp("hammered")
    config = load_config(
        None,
        [
            f"model.path={random_model_dir}",
            f"run.output_dir={tmp_path}",
            f"run.home={tmp_path / 'home'}",
            "run.mode=conventional",
            "run.steps_per_round=2",
            "run.train_during_round=false",
            f"run.max_steps={HAMMERED_STEPS}",
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
    return HammeredRun(outcome["result"], tmp_path / "hammered", hammers)


@pytest.mark.slow
@pytest.mark.timeout(600)
class TestAHammeredRun:
    """The live run hammered on every port it binds (``hammered``): one property each."""

    def test_a_hammered_run_trains_all_its_steps(self, hammered: HammeredRun) -> None:
        summary = hammered.result.summary
        assert summary["steps"] == summary["final_policy_version"] == HAMMERED_STEPS, summary

    def test_no_stage_of_a_hammered_run_logged_a_traceback(self, hammered: HammeredRun) -> None:
        for log in ("preprocessor.log", "trainer0.log", "actor0.log"):
            assert "Traceback" not in hammered.log(log), log

    def test_a_hammered_run_loses_no_rollout_and_receives_only_the_actors(
        self, hammered: HammeredRun
    ) -> None:
        last = json.loads((hammered.run_dir / "preprocessor.jsonl").read_text().splitlines()[-1])
        assert last["preprocessor/lost"] == last["preprocessor/lost_from_actors"] == 0, last
        # The zero above can fail: every rollout received was counted as the actor's (its stream pinned).
        final = json.loads((hammered.run_dir / "preprocessor.final.json").read_text())
        assert final["preprocessor/received_from_actors"] == final["preprocessor/received"], final
        assert final["preprocessor/received"] >= HAMMERED_STEPS * 16, final

    def test_every_batch_of_a_hammered_run_reaches_the_trainer(self, hammered: HammeredRun) -> None:
        trained = [rollout_id for record in hammered.result.records for rollout_id, _ in record["rollouts"]]
        assert len(trained) == HAMMERED_STEPS * 16 and len(set(trained)) == len(trained)

    def test_the_hammer_kept_connecting_for_the_whole_run(self, hammered: HammeredRun) -> None:
        connections = [hammer.connections for hammer in hammered.hammers]
        assert sum(connections) > 100, connections

    def test_a_conventional_actor_waiting_for_weights_stops_on_shutdown(self, hammered: HammeredRun) -> None:
        """The trainer takes the last step only once the actor has generated the whole round and waits for
        its weights, which never come. The actor must wake on the trainer's Shutdown and exit on its own,
        not be killed by the launcher after its grace period (its closing line missing)."""
        log = hammered.log("actor0.log")
        assert "shutdown: trainer finished" in log, log[-2000:]
        assert ACTOR_CLOSING_LINE.search(log), f"the actor was killed, it did not exit:\n{log[-2000:]}"
