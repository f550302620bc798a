"""Reliability against damaged input, for each kind of receiving socket and for a live run (issue 15,
wire part).

Socket-level tests drive the platform's ``Receiver`` over real ZeroMQ with a stranger's frames. The
live run goes through ``launch`` as ``pipelinerl run`` does, with a small random model, once for the
module; each of its tests checks one property. What a stage did is read from what it wrote (its log,
its JSON-lines records), never from timings. A conventional run's actor stopping on shutdown while
it waits for weights (issue 15 too) is checked on the hammered run of ``test_stray_peers.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq

from pipelinerl.bench.fault_frames import (
    damaged_frames,
    impossible_rollouts,
    numbered,
    stranger_rollout,
)
from pipelinerl.launch.launcher import launch
from pipelinerl.platform.config import load_config
from pipelinerl.platform.curve_keys import present_client_keys, run_keys
from pipelinerl.platform.transport import MessageTooLarge, Receiver, Sender
from pipelinerl.platform.wire import (
    Rollout,
    Shutdown,
)
from pipelinerl.tasks import build_task
from tests.conftest import wait_until, worker_port
from tests.integration.test_pipeline import check_records_against_token_data

_next_port = iter(range(worker_port(27500), worker_port(27700), 20))

# The line an actor logs as its last when ``Actor.run`` returns; a stage the launcher had to
# SIGTERM or SIGKILL after its grace period never writes it.
ACTOR_CLOSING_LINE = re.compile(r"actor 0: \d+ tokens, \d+ updates")


def small_config(tmp_path: Path, model_dir: Path, *overrides: str):
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            f"run.output_dir={tmp_path}",
            f"run.home={tmp_path / 'home'}",
            "run.max_steps=4",
            "rl.group_size=4",
            "rl.batch_size=16",
            "actor.max_in_flight=16",
            "task.eval_problems=16",
            f"transport.base_port={next(_next_port)}",
            *overrides,
        ],
    )


# ----- damaged frames -------------------------------------------------------------------------------

FRAMES_PER_SOCKET = 10_000


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def refused(message: object) -> bool:
    """What a stage refuses besides what ``decode`` does: not a rollout of this run."""
    return not isinstance(message, Rollout) or message.run_id != "run"


@pytest.mark.parametrize("kind", ["pull-bound", "pull-connecting", "sub-connecting"])
def test_each_kind_of_receiving_socket_survives_ten_thousand_damaged_frames(context, kind) -> None:
    """The preprocessor's rollout PULL binds; the trainer's batch PULL and every SUB connect. A raw
    peer of the right socket type sends 10,000 damaged frames with good rollouts among them: every
    damaged one is counted (malformed, or refused by the stage's own check) and every good one arrives."""
    port = worker_port(27690 + ["pull-bound", "pull-connecting", "sub-connecting"].index(kind))
    address = f"tcp://127.0.0.1:{port}"
    socket_kind = "sub" if kind.startswith("sub") else "pull"
    peer = context.socket(zmq.PUB if socket_kind == "sub" else zmq.PUSH)
    peer.setsockopt(zmq.SNDHWM, 0)
    peer.setsockopt(zmq.LINGER, 0)
    receiver_binds = kind == "pull-bound"
    if not receiver_binds:
        peer.bind(address)
    receiver = Receiver(context, address, socket_kind, bind=receiver_binds, high_water_mark=100_000)
    if receiver_binds:
        peer.connect(address)
    try:
        good = [stranger_rollout(i, run_id="run") for i in range(100)]
        if socket_kind == "sub":  # the slow joiner: wait until a message gets through
            hellos = itertools.count(1)

            def joined() -> bool:
                peer.send_multipart(numbered(Shutdown(reason="hello"), next(hellos), "hello"))
                return receiver.recv(timeout_s=0.1) is not None

            wait_until(joined, 30, "the subscriber to join", interval_s=0)
            while receiver.recv(timeout_s=0.2) is not None:  # the other hellos
                pass
        sent = Counter()
        for index, (damage, frames) in enumerate(damaged_frames(FRAMES_PER_SOCKET, seed=port)):
            peer.send_multipart(frames)
            sent[damage] += 1
            if index % 100 == 0:
                peer.send_multipart(numbered(good[index // 100], index // 100 + 1, "good"))
        received, other = [], 0
        while (message := receiver.recv(timeout_s=2.0)) is not None:
            if refused(message):
                other += 1
            else:
                received.append(message)
        assert [m.rollout_id for m in received] == [m.rollout_id for m in good]
        # Refused: by decode (malformed), as a replayed number (a damaged envelope), or by the stage.
        counts = (receiver.malformed_count, receiver.rejected_count, other, sent)
        assert receiver.malformed_count + receiver.rejected_count + other == FRAMES_PER_SOCKET, counts
        assert receiver.malformed_count > FRAMES_PER_SOCKET // 2
    finally:
        receiver.close()
        peer.close(linger=0)


def test_an_oversized_part_is_refused_by_zeromq_and_counted_as_a_dropped_connection(context) -> None:
    receiver = Receiver(context, "tcp://127.0.0.1:*", "pull", bind=True, max_message_bytes=2**20)
    peer = context.socket(zmq.PUSH)
    peer.setsockopt(zmq.LINGER, 0)
    peer.connect(receiver.address)
    try:
        peer.send_multipart([b"x" * (2**20 + 1)])
        assert receiver.recv(timeout_s=1.0) is None
        # Counted from the socket's monitor, read on a thread of its own.
        wait_until(lambda: receiver.peer_disconnects, 30, "the oversized peer's connection dropped")
        assert receiver.peer_disconnects == 1
        # ZeroMQ reconnects the peer: its next, good message arrives
        peer.send_multipart(numbered(Shutdown(reason="after"), 1))
        assert receiver.recv(timeout_s=10) == Shutdown(reason="after")
    finally:
        receiver.close()
        peer.close(linger=0)


def zmtp_push_announcing(size: int) -> bytes:
    """A ZMTP 3.0 NULL handshake as a PUSH, then the start of one message part announcing ``size`` bytes."""
    greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" * 32
    ready = b"\x05READY" + b"\x0bSocket-Type" + (4).to_bytes(4, "big") + b"PUSH"
    return greeting + b"\x04" + bytes([len(ready)]) + ready + b"\x02" + size.to_bytes(8, "big") + b"x" * 4096


def test_a_part_announcing_a_gibibyte_is_refused_before_it_is_allocated(context) -> None:
    receiver = Receiver(context, "tcp://127.0.0.1:*", "pull", bind=True, max_message_bytes=2**20)
    host, port = receiver.address.removeprefix("tcp://").rsplit(":", 1)
    rss_before = psutil.Process().memory_info().rss
    try:
        for _ in range(20):
            with socket.create_connection((host, int(port)), timeout=10) as raw:
                raw.sendall(zmtp_push_announcing(2**30))
                raw.settimeout(10)
                while raw.recv(4096):  # ZeroMQ answers its greeting, then closes the connection
                    pass
        assert receiver.recv(timeout_s=0.5) is None
        assert receiver.peer_disconnects == 20
        assert psutil.Process().memory_info().rss - rss_before < 200 * 2**20, "20 GiB were announced"
    finally:
        receiver.close()


def test_a_sender_refuses_a_part_no_receiver_would_take(context) -> None:
    sender = Sender(context, "tcp://127.0.0.1:*", "push", bind=True, max_message_bytes=1024)
    try:
        with pytest.raises(MessageTooLarge, match="transport.max_message_mib"):
            sender.send(Shutdown(reason="x" * 2000), timeout_s=0)
        assert sender.sent_count == 0
    finally:
        sender.close()


# ----- a live run under a flood ------------------------------------------------------------------------


def stage_process(run_dir: Path, module: str) -> psutil.Process | None:
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if module in cmdline and str(run_dir) in " ".join(cmdline):
            return process
    return None


# The preprocessor reads its rollout socket between the batches it holds for the trainer, so how much of
# the flood it has read by its last batch grows with the steps: 10 steps read all of it on an idle
# machine but only 4,610 frames on a loaded one (CI); 30 leave room (their last record must count it all).
FLOODED_STEPS = 30


@dataclass(frozen=True)
class FloodedRun:
    result: Any  # launcher.RunResult
    run_dir: Path
    impossible: dict[str, list[Rollout]]
    rss: list[int]  # the preprocessor's, from the flood's start to the run's end

    def log(self, name: str) -> str:
        return (self.run_dir / "logs" / name).read_text()

    def last_record(self) -> dict[str, Any]:
        """The preprocessor's record of its last batch."""
        return json.loads((self.run_dir / "preprocessor.jsonl").read_text().splitlines()[-1])


@pytest.fixture(scope="module")
def flooded(tmp_path_factory: pytest.TempPathFactory, random_model_dir: Path) -> FloodedRun:
    """10,000 damaged, truncated, garbage and wrong-schema frames, 300 well-formed but impossible or
    never-completing rollouts, 16 with tokens outside the vocabulary and 5 oversized parts, sent to
    the run's rollout socket while it trains, by a peer holding the run's keys (a stranger without
    them is refused at the handshake: ``test_reward_hacking.py``, ``test_authenticated_wire.py``)."""
    tmp_path = tmp_path_factory.mktemp("flooded")
    config = small_config(
        tmp_path,
        random_model_dir,
        "run.mode=pipeline",
        f"run.max_steps={FLOODED_STEPS}",
        "transport.max_message_mib=1",
    )
    run_id, run_dir = "flooded", (tmp_path / "flooded").resolve()
    problem_ids = [
        p.problem_id
        for p in build_task(config.task).problems("train", config.task.train_problems, config.run.seed)
    ]
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(result=launch(config, run_id=run_id)))
    thread.start()
    context = zmq.Context()
    stranger = context.socket(zmq.PUSH)
    stranger.setsockopt(zmq.SNDHWM, 0)  # queue everything here; the run's side stays bounded
    stranger.setsockopt(zmq.LINGER, 0)
    oversized = context.socket(zmq.PUSH)  # its own connection: ZeroMQ drops it, and what it queued
    oversized.setsockopt(zmq.LINGER, 0)
    rss: list[int] = []
    impossible = impossible_rollouts(run_id, problem_ids)
    try:
        # The flood starts once the preprocessor has sent its first batch: started, warm, memory settled.
        def first_batch_sent() -> bool:
            records = run_dir / "preprocessor.jsonl"
            if records.exists() and records.read_text():
                return True
            assert thread.is_alive(), "the run ended before its first batch"
            return False

        wait_until(first_batch_sent, 240, "the preprocessor's first batch")
        preprocessor = stage_process(run_dir, "pipelinerl.workers.preprocessor")
        assert preprocessor is not None
        rss.append(preprocessor.memory_info().rss)
        # Every run authenticates its peers, on loopback too: the flood comes from a process holding
        # the run's keys (keys that leaked), so that it reaches the decoder and the stage's checks.
        keys = run_keys(run_dir)
        present_client_keys(stranger, keys)
        stranger.connect(config.transport.address("rollouts"))
        # The rollouts the preprocessor accepts and batches (the trainer must refuse them) first in line,
        # then the rest of the impossible ones, then the damaged frames: whatever of the flood is still
        # unread near the run's end, the groups outside the vocabulary have been batched by then.
        seq = 0
        for kind in sorted(impossible, key=lambda kind: kind != "outside_vocabulary"):
            for rollout in impossible[kind]:
                stranger.send_multipart(numbered(rollout, seq := seq + 1, "impossible"))
        for _, frames in damaged_frames(FRAMES_PER_SOCKET, seed=7):
            stranger.send_multipart(frames)
        present_client_keys(oversized, keys)
        oversized.connect(config.transport.address("rollouts"))
        for _ in range(5):
            oversized.send_multipart([b"x" * (2**20 + 1)])

        def run_ended() -> bool:  # the preprocessor's memory sampled meanwhile
            with contextlib.suppress(psutil.NoSuchProcess):
                rss.append(preprocessor.memory_info().rss)
            return not thread.is_alive()

        wait_until(run_ended, 420, "the flooded run's end", interval_s=0.5)
    finally:
        thread.join(timeout=420)
        oversized.close(linger=0)
        stranger.close(linger=0)
        context.term()
    assert not thread.is_alive(), "the run did not finish"
    return FloodedRun(outcome["result"], run_dir, impossible, rss)


@pytest.mark.slow
@pytest.mark.timeout(600)
class TestAFloodedRun:
    """The live run under the flood (``flooded``): one property each."""

    def test_a_flooded_run_trains_all_its_steps(self, flooded: FloodedRun) -> None:
        summary = flooded.result.summary
        assert summary["steps"] == summary["final_policy_version"] == FLOODED_STEPS, summary

    def test_every_stage_of_a_flooded_run_keeps_running_to_the_end(self, flooded: FloodedRun) -> None:
        assert ACTOR_CLOSING_LINE.search(flooded.log("actor0.log"))
        for log in ("preprocessor.log", "trainer0.log", "actor0.log"):
            assert "Traceback" not in flooded.log(log), log

    def test_every_damaged_frame_and_impossible_rollout_is_refused_and_counted(
        self, flooded: FloodedRun
    ) -> None:
        last = flooded.last_record()
        refused = last["preprocessor/malformed"] + last["preprocessor/rejected"]
        assert refused >= FRAMES_PER_SOCKET + len(flooded.impossible["rejected"]), last

    def test_never_completing_groups_are_dropped_counted_and_bounded(self, flooded: FloodedRun) -> None:
        last = flooded.last_record()
        assert last["samples/dropped_incomplete_group"] >= len(flooded.impossible["never_complete"]) - 32, (
            last
        )
        sent = [
            json.loads(line) for line in (flooded.run_dir / "preprocessor.jsonl").read_text().splitlines()
        ]
        assert max(r["queue/rollouts"] for r in sent) <= 64, "incomplete groups were bounded"

    def test_an_oversized_part_drops_its_connection_and_is_counted(self, flooded: FloodedRun) -> None:
        last = flooded.last_record()
        assert last["preprocessor/peer_disconnects"] >= 1, last

    def test_nothing_of_the_actor_is_lost_under_the_flood(self, flooded: FloodedRun) -> None:
        last = flooded.last_record()
        assert last["preprocessor/lost_from_actors"] == 0, "the actor's rollouts all arrived, in order"
        final = json.loads((flooded.run_dir / "preprocessor.final.json").read_text())
        # The count above can fail: the actor's streams were pinned (its rollouts were counted as its own).
        assert final["preprocessor/received_from_actors"] >= FLOODED_STEPS * 16, final

    def test_the_trainer_refuses_every_rollout_outside_the_vocabulary(self, flooded: FloodedRun) -> None:
        assert flooded.result.records[-1]["trainer/rejected"] == len(flooded.impossible["outside_vocabulary"])

    def test_the_preprocessor_memory_stays_bounded_under_the_flood(self, flooded: FloodedRun) -> None:
        growth_mib = (max(flooded.rss) - flooded.rss[0]) / 2**20
        assert growth_mib < 100, f"the preprocessor grew by {growth_mib:.0f} MiB"

    def test_a_flooded_run_learns_from_the_actors_data_only(self, flooded: FloodedRun) -> None:
        """No stranger's rollout trained, and the run's statistics are what its tokens say."""
        result = flooded.result
        trained = {rollout_id for record in result.records for rollout_id, _ in record["rollouts"]}
        assert not any(rollout_id.startswith("stranger") for rollout_id in trained)
        check_records_against_token_data(result)
        last = flooded.last_record()
        figures = {
            "sent_damaged": FRAMES_PER_SOCKET,
            "sent_impossible": sum(map(len, flooded.impossible.values())),
            "sent_oversized": 5,
            **{key: last[key] for key in last if key.startswith(("preprocessor/", "samples/dropped"))},
            "trainer/rejected": result.records[-1]["trainer/rejected"],
            "preprocessor_rss_mib": [flooded.rss[0] / 2**20, max(flooded.rss) / 2**20],
        }
        print("flood figures:", json.dumps(figures))
