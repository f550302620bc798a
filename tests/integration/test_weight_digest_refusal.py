"""Digests over real gloo weight groups, members on threads, and the trainer's digests over a real
ZeroMQ notice socket: a bucket injected into the broadcast (bytes other than those the trainer
hashed) is refused, nothing of its update is handed out or loaded into the actor's model, and every
broadcast of the update still completes. (The same between two processes: ``test_weight_group``.)"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import zmq

from pipelinerl.platform.dtypes import dtype_name
from pipelinerl.platform.jsonl import JsonlWriter
from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.transport import Receiver, Sender
from pipelinerl.platform.weight_digest import bucket_digest
from pipelinerl.platform.weights import BucketsRefused, ReceivedUpdate, WeightGroup
from pipelinerl.platform.wire import WeightDigests, WeightUpdate
from pipelinerl.workers.actor import Actor
from pipelinerl.workers.checked_receive import announced_digests
from pipelinerl.workers.rebase_handshake import RebaseHandshake
from pipelinerl.workers.staged_weights import StagedWeights
from tests.conftest import worker_port
from tests.integration.test_weight_group import BUCKET_BYTES, InjectingGroup, digested_update

PORT = 28220  # 28220-28229


def form(port: int, bucket_bytes: int) -> tuple[InjectingGroup, WeightGroup]:
    joined: list[WeightGroup] = []
    thread = threading.Thread(
        target=lambda: joined.append(WeightGroup.join("127.0.0.1", port, 1, 2, timeout_s=30)), daemon=True
    )
    thread.start()
    leader = InjectingGroup.lead("127.0.0.1", port, 2, bucket_bytes=bucket_bytes, timeout_s=30)
    thread.join(timeout=30)
    return leader, joined[0]


def receive_in_thread(target: Any, *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def test_a_received_update_is_refused_at_the_altered_bucket_and_only_there() -> None:
    leader, member = form(worker_port(PORT + 1), BUCKET_BYTES)
    tensors = digested_update(1.0)
    shapes, dtypes = [list(t.shape) for t in tensors], [dtype_name(t) for t in tensors]
    received: list[ReceivedUpdate] = []
    thread = receive_in_thread(lambda: received.append(member.receive_update(shapes, dtypes)))
    leader.tampered = 1
    announced = leader.send(tensors)  # the digests of what the trainer meant to send
    thread.join(timeout=30)
    assert announced == [bucket_digest([tensor]) for tensor in tensors]  # one tensor a bucket here
    with pytest.raises(BucketsRefused) as refused:
        received[0].check(announced)
    assert refused.value.buckets == [1]
    assert [a == b for a, b in zip(received[0].digests, announced, strict=True)] == [True, False, True, True]


def test_digests_that_are_not_one_per_bucket_refuse_every_bucket_yet_the_member_takes_part() -> None:
    leader, member = form(worker_port(PORT + 2), BUCKET_BYTES)
    tensors = digested_update(1.0)
    shapes, dtypes = [list(t.shape) for t in tensors], [dtype_name(t) for t in tensors]
    received: list[ReceivedUpdate] = []
    thread = receive_in_thread(lambda: received.append(member.receive_update(shapes, dtypes)))
    announced = leader.send(tensors)
    thread.join(timeout=30)
    assert received, "the member took part in every broadcast"
    with pytest.raises(BucketsRefused) as refused:
        received[0].check(announced[:3])
    assert refused.value.buckets == [0, 1, 2, 3] and "3 digests came for 4 buckets" in refused.value.reason


# ----- the trainer's digests on the notice socket -----


@pytest.fixture
def notice_pair() -> Iterator[tuple[Sender, Receiver]]:
    context = zmq.Context()
    with (
        Sender(context, "tcp://127.0.0.1:*", "xpub", bind=True) as publisher,
        Receiver(context, publisher.address, "sub", bind=False) as subscriber,
    ):
        assert publisher.wait_for_subscribers(1, 30)
        yield publisher, subscriber
    context.term()


def test_the_digests_of_the_version_received_are_read_and_a_notice_before_them_is_kept(notice_pair) -> None:
    publisher, subscriber = notice_pair
    digests = [bucket_digest([torch.ones(3)])]
    publisher.send(WeightDigests(policy_version=1, bucket_digests=[bytes(32)]))  # a stale repeat: skipped
    publisher.send(WeightDigests(policy_version=2, bucket_digests=digests))
    assert announced_digests(subscriber, 2, wait_s=30) == (digests, None)
    following = notice_for(3, digested_update(1.0))
    publisher.send(following)  # v2's digests were lost: the next notice comes first
    assert announced_digests(subscriber, 2, wait_s=30) == (None, following)
    started = time.monotonic()
    assert announced_digests(subscriber, 3, wait_s=0.5) == (None, None)  # nothing comes at all
    assert time.monotonic() - started < 5


# ----- the actor: refused, counted, nothing loaded, then caught up -----


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.zeros(32, 32))
        self.b = torch.nn.Parameter(torch.zeros(1024))
        self.c = torch.nn.Parameter(torch.zeros(64, 32, dtype=torch.bfloat16))
        self.d = torch.nn.Parameter(torch.zeros(4, 4))


class StubEngine:
    """The engine as ``apply_staged`` sees it: ``load(model)`` inside ``update_weights``."""

    def __init__(self) -> None:
        self.model = Model()
        self.policy_version = 0
        self.num_in_flight = 0
        self.last_update_s: dict[str, float] = {}

    def update_weights(self, new_version: int, load: Any) -> float:
        with torch.no_grad():
            load(self.model)
        self.policy_version = new_version
        return 0.001


def bare_actor(run_dir: Path, notices: Receiver) -> Actor:
    """An actor with only what receiving and loading an update touch (no model files, no rollout
    socket): its notice socket is ``notices``."""
    actor = Actor.__new__(Actor)
    actor.config = SimpleNamespace(run=SimpleNamespace(mode="pipeline"))  # type: ignore[assignment]
    actor.actor_id = 0
    actor.engine = StubEngine()  # type: ignore[assignment]
    actor.staged = StagedWeights()
    actor.weights_ready = threading.Condition()
    actor.notices = notices
    actor.next_notice = None
    actor.metrics = JsonlWriter(run_dir / "actor0.jsonl")
    actor.pauses_s, actor.tokens_generated, actor.idle_s, actor.idle_started = [], 0, 0.0, None
    actor.received_s = 0.0
    actor._last_report = (time.monotonic(), 0, 0.0)
    actor._report_lock = threading.Lock()
    actor.buckets_refused, actor.refused_version = 0, -1
    actor.handshake = RebaseHandshake(run_dir, enabled=False)  # no restart of the trainer role under way
    return actor


def notice_for(version: int, tensors: list[torch.Tensor]) -> WeightUpdate:
    return WeightUpdate(
        policy_version=version,
        parameter_names=["a", "b", "c", "d"],
        parameter_shapes=[list(t.shape) for t in tensors],
        parameter_dtypes=[dtype_name(t) for t in tensors],
        samples_trained=0,
        created_at=0.0,
    )


def test_the_actor_refuses_a_tampered_update_whole_counts_it_and_loads_the_next(
    tmp_path, caplog, notice_pair
) -> None:
    publisher, subscriber = notice_pair
    leader, member = form(worker_port(PORT + 3), BUCKET_BYTES)
    actor = bare_actor(tmp_path, subscriber)

    def publish(version: int, tensors: list[torch.Tensor], tampered: int | None) -> None:
        thread = receive_in_thread(actor.receive_into_staging, member, notice_for(version, tensors))
        leader.tampered = tampered
        digests = leader.send(tensors)  # completes: the actor took part in every broadcast
        publisher.send(WeightDigests(policy_version=version, bucket_digests=digests))  # as the trainer
        thread.join(timeout=30)
        assert not thread.is_alive()

    with caplog.at_level(logging.WARNING, logger="pipelinerl.actor"):
        publish(1, digested_update(1.0), tampered=3)  # the last bucket: the first three arrived intact
    model = actor.engine.model  # type: ignore[attr-defined]
    assert all(not param.any() for param in model.parameters()), "nothing of a refused update loads"
    assert actor.engine.policy_version == 0 and actor.staged.version == -1
    assert actor.buckets_refused == 1 and actor.refused_version == 1
    assert "weights v1: bucket 3 refused" in caplog.text and "keeps weights v0" in caplog.text

    sent = digested_update(-2.0)
    publish(2, sent, tampered=None)
    assert actor.engine.policy_version == 2
    assert all(torch.equal(param, tensor) for param, tensor in zip(model.parameters(), sent, strict=True))
    actor.metrics.close()
    records = [json.loads(line) for line in (tmp_path / "actor0.jsonl").read_text().splitlines()]
    assert [r[registry.ACTOR_WEIGHT_BUCKETS_REFUSED] for r in records] == [1, 1]
    assert registry.UPDATE_PAUSE_MS not in records[0] and registry.UPDATE_PAUSE_MS in records[1]


def test_a_conventional_round_waiting_for_a_refused_version_goes_on(tmp_path, notice_pair) -> None:
    actor = bare_actor(tmp_path, notice_pair[1])
    actor.stop = SimpleNamespace(is_set=lambda: False)  # type: ignore[assignment]
    actor.refused_version = 3
    started = time.monotonic()
    actor.wait_for_version(3)  # returns at once: version 3 will never load
    assert time.monotonic() - started < 1
    waiter = receive_in_thread(actor.wait_for_version, 4)
    waiter.join(timeout=0.3)
    assert waiter.is_alive(), "version 4 is neither loaded nor refused yet"
    actor.refused_version = 4
    with actor.weights_ready:
        actor.weights_ready.notify_all()
    waiter.join(timeout=5)
    assert not waiter.is_alive()
