"""``pipelinerl bench transport``: rollouts through the platform's ZeroMQ path against raw pyzmq.

Run: ``pipelinerl bench transport [--run-dir runs/<id>] [--quick] [--curve | --plain]``; writes
``docs/benchmarks/transport.json``.

``--curve`` (the default: what every run uses, on loopback too) gives both paths' sockets a fresh pair
of CurveZMQ keys, as the launcher gives a run (authenticated and encrypted); ``--plain`` measures
plain TCP, so the two records together give what authentication costs.

The platform path is exactly what the actor and the preprocessor run: a ``wire.Rollout`` encoded
by ``wire.encode`` (msgpack header + one raw frame per array) and sent by ``transport.Sender``
(PUSH, connecting, the actor's send-then-wait pattern), received by ``transport.Receiver`` (PULL,
bound) and decoded and validated by ``wire.decode``. The baseline sends the *same bytes* (the
frames encoded once beforehand) with bare pyzmq sockets and receives them without decoding, so the
difference is the platform's framing: encoding, validation, decoding and its socket wrappers.

The receiving (or echoing) side is a separate process, as the preprocessor is. Rollout sizes:

* ``embedded``: the embedded task's prompts and reference completions (+ EOS), 4 to 80 tokens;
* ``1k`` / ``8k``: 256 prompt and 1,024 / 8,192 completion tokens, token ids of a 150k vocabulary,
  4 characters of completion text per token (long-form reasoning with a BPE tokenizer).

Measurements per size and path: throughput (N rollouts pushed as fast as the socket takes them;
rollouts/s and MB/s of frames, timed from the first send to the last receive on one monotonic
clock) and latency (ping-pong: the peer echoes each rollout back, decoding and re-encoding it on
the platform path; one-way latency = round trip / 2, p50 and p99).

``headroom_over_actor`` = platform rollouts/s for ``embedded`` rollouts / the rate at which the
actor produces rollouts, taken from (first that applies): a run directory's actor records
(``--run-dir``), an engine benchmark's record (``--engine-json``, default
``docs/benchmarks/engine.json`` when present), or a short continuous-batching run of the
transformers engine on the embedded model, measured now. The record names the source.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from pipelinerl.bench.report import markdown_table
from pipelinerl.platform.curve_keys import (
    create_curve_keys,
    present_client_keys,
    run_keys,
    serve_with_keys,
    stop_authentication,
)
from pipelinerl.platform.transport import Receiver, Sender
from pipelinerl.platform.wire import Rollout, encode
from pipelinerl.tasks import get_task
from pipelinerl.tasks.base import reference_completion

if TYPE_CHECKING:
    from rich.progress import Progress

    from pipelinerl.bench.actor_rate import ActorRate
    from pipelinerl.platform.curve_keys import CurveKeys

LONG_VOCAB = 150_000  # token ids of long rollouts span a Qwen-sized vocabulary
CHARS_PER_TOKEN = 4  # completion text per token of a BPE tokenizer on English/maths
PEER_START_TIMEOUT_S = 60.0
MEASUREMENT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class RolloutShape:
    name: str
    prompt_tokens: int | None  # None: the embedded task's own lengths
    completion_tokens: int | None
    throughput_count: int  # rollouts per throughput measurement (full run)
    latency_count: int  # round trips per latency measurement (full run)


SHAPES: tuple[RolloutShape, ...] = (
    RolloutShape("embedded", None, None, throughput_count=20_000, latency_count=2_000),
    RolloutShape("1k", 256, 1024, throughput_count=10_000, latency_count=1_000),
    RolloutShape("8k", 256, 8192, throughput_count=2_000, latency_count=500),
)
QUICK_DIVISOR = 20  # --quick measures 1/20 of the full counts


@dataclass(frozen=True)
class TransportBenchSettings:
    shapes: tuple[RolloutShape, ...] = SHAPES
    count_divisor: int = 1
    repeats: int = 3
    warmup: int = 50
    high_water_mark: int = 32  # the run's transport.queue_size
    seed: int = 0
    curve: bool = True  # CurveZMQ keys on both paths' sockets, as every run has them

    @classmethod
    def quick(cls, **overrides: Any) -> TransportBenchSettings:
        values: dict[str, Any] = dict(count_divisor=QUICK_DIVISOR, repeats=1, warmup=10)
        values.update(overrides)
        return cls(**values)

    def throughput_count(self, shape: RolloutShape) -> int:
        return max(20, shape.throughput_count // self.count_divisor)

    def latency_count(self, shape: RolloutShape) -> int:
        return max(20, shape.latency_count // self.count_divisor)


# ----- rollouts like the actor's -----


def build_rollouts(shape: RolloutShape, count: int, seed: int) -> list[Rollout]:
    """``count`` distinct rollouts of ``shape``, built as the actor builds them."""
    rng = np.random.default_rng(seed)
    text_rng = random.Random(seed)
    if shape.prompt_tokens is None:
        pairs = _embedded_sequences(count, seed)
    else:
        assert shape.completion_tokens is not None
        pairs = [
            (
                rng.integers(0, LONG_VOCAB, shape.prompt_tokens).tolist(),
                rng.integers(0, LONG_VOCAB, shape.completion_tokens).tolist(),
                "".join(
                    text_rng.choices(
                        "abcdefghij klmnop=+0123456789\n", k=CHARS_PER_TOKEN * shape.completion_tokens
                    )
                ),
            )
            for _ in range(count)
        ]
    rollouts = []
    for index, (prompt, completion, text) in enumerate(pairs):
        n_tokens = len(completion)
        # Versions as in a pipeline run: a sequence started under v and finished under v + 1 or v + 2.
        switches = np.sort(rng.integers(0, n_tokens + 1, 2))
        versions = 100 + (np.arange(n_tokens) >= switches[0]) + (np.arange(n_tokens) >= switches[1])
        rollouts.append(
            Rollout(
                rollout_id=f"{rng.integers(0, 2**63):032x}",
                run_id="20261122-0000-bench",
                group_id=f"{index // 4:032x}",
                group_size=4,
                problem_id=f"arithmetic-train-0-{index}",
                split="train",
                actor_id=0,
                prompt_token_ids=np.asarray(prompt, dtype=np.int32),
                completion_token_ids=np.asarray(completion, dtype=np.int32),
                behaviour_logprobs=-rng.exponential(0.5, n_tokens).astype(np.float32),
                token_versions=versions.astype(np.int32),
                finished=True,
                completion_text=text,
                created_at=time.time(),
            )
        )
    return rollouts


def _embedded_sequences(count: int, seed: int) -> list[tuple[list[int], list[int], str]]:
    from pipelinerl.tasks.tokenizer import build_tokenizer, encode_completion, encode_prompt  # noqa: PLC0415 (transformers: the spawned peer imports this module)

    task = get_task("arithmetic")
    tokenizer = build_tokenizer()
    sequences = []
    for problem in task.problems("train", count, seed):
        completion = reference_completion(task, problem)
        sequences.append(
            (
                encode_prompt(tokenizer, problem.prompt),
                encode_completion(tokenizer, completion),
                completion,
            )
        )
    return sequences


def message_bytes(frames: list[Any]) -> int:
    return sum(memoryview(frame).nbytes for frame in frames)


# ----- the two paths' sockets -----


class _Ends:
    """One path's sockets: the platform's ``Sender``/``Receiver``, or bare pyzmq with the same options.

    ``bind_pull`` and ``connect_push`` return the socket (a context manager) and a function that
    receives or sends one message: a ``Rollout`` on the platform path, a list of frames on the raw one.
    """

    def __init__(self, context: Any, path: str, high_water_mark: int, keys_dir: str | None = None) -> None:
        if path not in ("platform", "raw"):
            raise ValueError(f"path must be 'platform' or 'raw', got {path!r}")
        self.context, self.path, self.high_water_mark = context, path, high_water_mark
        self.keys: CurveKeys | None = None
        if keys_dir is not None:
            self.keys = run_keys(Path(keys_dir))

    def bind_pull(self) -> tuple[Any, str, Callable[[], Any]]:
        if self.path == "platform":
            receiver = Receiver(
                self.context,
                "tcp://127.0.0.1:*",
                "pull",
                bind=True,
                high_water_mark=self.high_water_mark,
                keys=self.keys,
            )

            def receive() -> Any:
                message = receiver.recv(timeout_s=MEASUREMENT_TIMEOUT_S)
                if message is None:
                    raise TimeoutError(f"no message within {MEASUREMENT_TIMEOUT_S:g} s")
                return message

            return receiver, receiver.address, receive
        socket = self._raw_socket(zmq.PULL)
        if self.keys is not None:
            serve_with_keys(socket, self.keys)
        socket.bind("tcp://127.0.0.1:*")

        def receive_raw() -> Any:
            if not socket.poll(MEASUREMENT_TIMEOUT_S * 1000):
                raise TimeoutError(f"no message within {MEASUREMENT_TIMEOUT_S:g} s")
            return socket.recv_multipart(copy=False)

        return socket, socket.getsockopt_string(zmq.LAST_ENDPOINT), receive_raw

    def connect_push(self, address: str) -> tuple[Any, Callable[[Any], None]]:
        if self.path == "platform":
            sender = Sender(
                self.context,
                address,
                "push",
                bind=False,
                high_water_mark=self.high_water_mark,
                keys=self.keys,
            )

            def send(message: Any) -> None:
                # The actor's pattern: try at once, then wait in slices while the queue is full.
                if not sender.send(message, timeout_s=0):
                    while not sender.send(message, timeout_s=1.0):
                        pass

            return sender, send
        socket = self._raw_socket(zmq.PUSH)
        if self.keys is not None:
            present_client_keys(socket, self.keys)
        socket.connect(address)
        return socket, lambda frames: socket.send_multipart(frames)

    def _raw_socket(self, socket_type: int) -> Any:
        socket = self.context.socket(socket_type)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, self.high_water_mark)
        socket.setsockopt(zmq.RCVHWM, self.high_water_mark)
        if socket_type == zmq.PUSH:
            socket.setsockopt(zmq.IMMEDIATE, 1)
        return socket


# ----- the peer process (the preprocessor's side) -----


def _peer_main(control: Connection) -> None:
    """Serve measurement commands from ``control`` until it sends None (runs in a child process).

    ``("sink", path, n, hwm, keys_dir)``: bind, receive the warm-up count the parent sends next, then
    ``n`` messages, and answer the monotonic time of the last. ``("echo", path, n, hwm, keys_dir)``:
    bind, connect back to the address the parent sends, send every one of ``n`` messages back.
    ``keys_dir``: the run directory of the CurveZMQ keys both ends use, or None (plain TCP).
    """
    context = zmq.Context()
    try:
        while (command := control.recv()) is not None:
            kind, path, total, high_water_mark, keys_dir = command
            ends = _Ends(context, path, high_water_mark, keys_dir)
            pull, address, receive = ends.bind_pull()
            with pull:
                control.send(address)
                if kind == "sink":
                    for _ in range(control.recv()):
                        receive()
                    control.send("warm")
                    for _ in range(total):
                        receive()
                    control.send(time.perf_counter())
                    continue
                push, send = ends.connect_push(control.recv())
                with push:
                    for _ in range(total):
                        send(receive())
                    control.recv()  # the last echo arrived: closing now drops nothing (LINGER 0)
    finally:
        stop_authentication(context)
        context.destroy(linger=0)


class Peer:
    """The child process that receives or echoes, and the pipe that drives it."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")  # no fork of a process that may hold torch threads
        self.control, child_end = context.Pipe()
        self.process = context.Process(target=_peer_main, args=(child_end,), name="bench-transport-peer")
        self.process.start()
        child_end.close()

    def recv(self, timeout_s: float = MEASUREMENT_TIMEOUT_S) -> Any:
        if not self.control.poll(timeout_s):
            raise TimeoutError(f"the transport peer process did not answer within {timeout_s:g} s")
        return self.control.recv()

    def close(self) -> None:
        with contextlib.suppress(OSError):  # the peer may be gone already
            self.control.send(None)
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)
        self.control.close()


# ----- measurements (this process is the actor's side) -----


def _messages(path: str, rollouts: list[Rollout]) -> list[Any]:
    """What each path sends: rollouts to encode on the way (platform), or their frames encoded once."""
    if path == "platform":
        return list(rollouts)
    return [[bytes(frame) for frame in encode(rollout)] for rollout in rollouts]


def measure_throughput(
    peer: Peer,
    path: str,
    rollouts: list[Rollout],
    count: int,
    settings: TransportBenchSettings,
    on_progress: Callable[[int], None] | None = None,
    keys_dir: str | None = None,
) -> dict[str, float]:
    """Push ``count`` rollouts (cycling through ``rollouts``); rollouts/s and MB/s at the receiver."""
    messages = _messages(path, rollouts)
    sizes = [message_bytes(encode(rollout)) for rollout in rollouts]
    total_bytes = sum(sizes[index % len(sizes)] for index in range(count))
    context = zmq.Context()
    try:
        peer.control.send(("sink", path, count, settings.high_water_mark, keys_dir))
        address = peer.recv(PEER_START_TIMEOUT_S)
        sender, send = _Ends(context, path, settings.high_water_mark, keys_dir).connect_push(address)
        with sender:
            peer.control.send(settings.warmup)
            for index in range(settings.warmup):
                send(messages[index % len(messages)])
            peer.recv()  # "warm": the peer has received the warm-up messages
            started = time.perf_counter()
            step = max(1, count // 50)
            for index in range(count):
                send(messages[index % len(messages)])
                if on_progress is not None and (index + 1) % step == 0:
                    on_progress(step)
            last_received = peer.recv()
    finally:
        _destroy(context)
    elapsed = last_received - started
    return {
        "rollouts": count,
        "seconds": elapsed,
        "rollouts_per_s": count / elapsed,
        "mb_per_s": total_bytes / elapsed / 1e6,
    }


def measure_latency(
    peer: Peer,
    path: str,
    rollouts: list[Rollout],
    count: int,
    settings: TransportBenchSettings,
    on_progress: Callable[[int], None] | None = None,
    keys_dir: str | None = None,
) -> dict[str, float]:
    """Ping-pong ``count`` rollouts through the echoing peer; one-way latency = round trip / 2."""
    messages = _messages(path, rollouts)
    context = zmq.Context()
    round_trips: list[float] = []
    try:
        peer.control.send(("echo", path, settings.warmup + count, settings.high_water_mark, keys_dir))
        peer_address = peer.recv(PEER_START_TIMEOUT_S)
        ends = _Ends(context, path, settings.high_water_mark, keys_dir)
        receiver, own_address, receive = ends.bind_pull()
        sender, send = ends.connect_push(peer_address)
        with sender, receiver:
            peer.control.send(own_address)
            for index in range(settings.warmup):
                send(messages[index % len(messages)])
                receive()
            step = max(1, count // 50)
            for index in range(count):
                started = time.perf_counter()
                send(messages[index % len(messages)])
                receive()
                round_trips.append(time.perf_counter() - started)
                if on_progress is not None and (index + 1) % step == 0:
                    on_progress(step)
            peer.control.send("close")
    finally:
        _destroy(context)
    one_way_us = np.asarray(round_trips) / 2 * 1e6
    return {
        "round_trips": count,
        "one_way_us_p50": float(np.percentile(one_way_us, 50)),
        "one_way_us_p99": float(np.percentile(one_way_us, 99)),
        "one_way_us_mean": float(one_way_us.mean()),
    }


def _destroy(context: Any) -> None:
    stop_authentication(context)  # the ZAP thread of a context that bound a CURVE server
    context.destroy(linger=0)


# ----- the benchmark -----


def run_transport_bench(
    settings: TransportBenchSettings, actor_rate: ActorRate, progress: Progress | None = None
) -> dict[str, Any]:
    """Throughput and latency of both paths for every shape; the headline and details for the record."""
    per_shape: dict[str, dict[str, Any]] = {}
    keys_home = tempfile.TemporaryDirectory(prefix="bench-transport-keys-")
    keys_dir: str | None = None
    if settings.curve:  # a fresh pair for this benchmark, as the launcher writes one per run
        keys_dir = str(create_curve_keys(Path(keys_home.name)).parent)
    peer = Peer()
    try:
        for shape in settings.shapes:
            rollouts = build_rollouts(shape, 64, settings.seed)
            sizes = [message_bytes(encode(rollout)) for rollout in rollouts]
            entry: dict[str, Any] = {
                "message_bytes_mean": float(np.mean(sizes)),
                "completion_tokens_mean": float(np.mean([len(r.completion_token_ids) for r in rollouts])),
            }
            throughput_count = settings.throughput_count(shape)
            latency_count = settings.latency_count(shape)
            for path in ("platform", "raw"):
                runs = []
                for repeat in range(settings.repeats):
                    task = (
                        None
                        if progress is None
                        else progress.add_task(
                            f"{shape.name}: {path} throughput ({repeat + 1})", total=throughput_count
                        )
                    )
                    advance = _advance(progress, task)
                    count = throughput_count
                    runs.append(measure_throughput(peer, path, rollouts, count, settings, advance, keys_dir))
                best = statistics.median(run["rollouts_per_s"] for run in runs)
                task = (
                    None
                    if progress is None
                    else progress.add_task(f"{shape.name}: {path} latency", total=latency_count)
                )
                latency = measure_latency(
                    peer, path, rollouts, latency_count, settings, _advance(progress, task), keys_dir
                )
                entry[path] = {
                    "rollouts_per_s": best,
                    "mb_per_s": statistics.median(run["mb_per_s"] for run in runs),
                    "throughput_runs": runs,
                    **latency,
                }
            platform, raw = entry["platform"], entry["raw"]
            entry["platform_over_raw_throughput"] = platform["rollouts_per_s"] / raw["rollouts_per_s"]
            entry["added_latency_us_p50"] = platform["one_way_us_p50"] - raw["one_way_us_p50"]
            entry["added_latency_us_p99"] = platform["one_way_us_p99"] - raw["one_way_us_p99"]
            # At the actor's token rate, a rollout this long is produced this often.
            actor_rollouts_per_s = actor_rate.tokens_per_s / entry["completion_tokens_mean"]
            entry["headroom_at_actor_tokens_per_s"] = platform["rollouts_per_s"] / actor_rollouts_per_s
            per_shape[shape.name] = entry
    finally:
        peer.close()
        keys_home.cleanup()
    embedded = per_shape[settings.shapes[0].name]
    headline = {
        "headroom_over_actor": embedded["platform"]["rollouts_per_s"] / actor_rate.rollouts_per_s,
        "actor_rollouts_per_s": actor_rate.rollouts_per_s,
        "actor_rate_source": actor_rate.source,
        "transport_rollouts_per_s": embedded["platform"]["rollouts_per_s"],
        "transport_mb_per_s": embedded["platform"]["mb_per_s"],
        "raw_rollouts_per_s": embedded["raw"]["rollouts_per_s"],
        "added_latency_us_p50": embedded["added_latency_us_p50"],
        "added_latency_us_p99": embedded["added_latency_us_p99"],
        "curve": settings.curve,
    }
    details = {"actor_rate": actor_rate.as_dict(), "shapes": per_shape}
    notes = [
        (
            "both paths authenticated and encrypted with a fresh pair of CurveZMQ keys, as every run is"
            if settings.curve
            else "both paths plain TCP (--plain): no CurveZMQ, unlike a run"
        ),
        "platform: wire.encode + transport.Sender (PUSH, connect, the actor's send pattern) -> "
        "transport.Receiver (PULL, bind) + wire.decode, receiver in a separate process; raw: the same "
        "frames, encoded once beforehand, through bare pyzmq PUSH/PULL with the same options, not decoded.",
        "throughput: median of the repeats, from the first send to the last receive; latency: "
        "ping-pong through an echoing process (the platform path decodes and re-encodes), one way = "
        "round trip / 2.",
        f"headroom_over_actor = platform rollouts/s ({settings.shapes[0].name} rollouts) / the actor's "
        f"rollouts/s from {actor_rate.source}: {actor_rate.detail}. headroom_at_actor_tokens_per_s "
        "assumes the actor keeps its token rate on longer rollouts.",
    ]
    return {"headline": headline, "details": details, "notes": notes}


def _advance(progress: Progress | None, task: Any) -> Callable[[int], None] | None:
    if progress is None or task is None:
        return None
    return lambda n: progress.advance(task, n)


def render_transport_table(record: dict[str, Any]) -> str:
    rows = []
    for name, entry in record["shapes"].items():
        for path in ("platform", "raw"):
            measured = entry[path]
            rows.append(
                [
                    name,
                    path,
                    f"{entry['message_bytes_mean'] / 1e3:.1f}",
                    measured["rollouts_per_s"],
                    measured["mb_per_s"],
                    measured["one_way_us_p50"],
                    measured["one_way_us_p99"],
                    entry["headroom_at_actor_tokens_per_s"] if path == "platform" else None,
                ]
            )
    table = markdown_table(
        [
            "rollout",
            "path",
            "kB / rollout",
            "rollouts/s",
            "MB/s",
            "one-way p50 (µs)",
            "one-way p99 (µs)",
            "headroom at the actor's tokens/s",
        ],
        rows,
    )
    target = record["targets"]["headroom_over_actor"]
    verdict = {True: "met", False: "not met", None: "no value"}[target["met"]]
    return (
        f"{table}\n\nheadroom_over_actor = {record['headroom_over_actor']:,.0f}x "
        f"(target ≥ {target['at_least']:g}x: {verdict}); actor {record['actor_rollouts_per_s']:.1f} "
        f"rollouts/s from {record['actor_rate_source']}"
    )
