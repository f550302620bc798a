"""Damaged and impossible input for a run's sockets: what ``pipelinerl bench faults`` and the
reliability tests send (pure: frames are built here, sockets live elsewhere).

* ``mutate``: one random kind of damage to a message's frames (bytes overwritten, a bit flipped, a
  frame truncated, bytes inserted, frames dropped or added, a frame replaced by random bytes).
* ``damaged_frames``: a seeded stream of damaged, truncated, garbage and wrong-schema messages, each
  behind a numbered envelope as a platform socket sends it; every one must be refused by
  ``wire.decode`` or by a stage's checks.
* ``impossible_rollouts``: well-formed rollouts of the run itself whose values are impossible
  (tokens from the future, non-finite log-probs, token ids outside the vocabulary, oversized
  groups) or whose groups never complete.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np

from pipelinerl.platform.wire import (
    Envelope,
    Message,
    Rollout,
    Shutdown,
    TrainBatch,
    WeightUpdate,
    encode,
    encode_numbered,
)

KINDS = ("damaged", "truncated", "garbage", "wrong_schema")


def mutate(frames: list[bytes], rng: random.Random) -> list[bytes]:
    """``frames`` with one random kind of damage."""
    frames = list(frames) or [b""]
    index = rng.randrange(len(frames))
    frame = bytearray(frames[index])
    kind = rng.randrange(7)
    if kind == 0 and frame:  # overwrite a few bytes
        for _ in range(rng.randint(1, 4)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
    elif kind == 1 and frame:  # flip one bit
        frame[rng.randrange(len(frame))] ^= 1 << rng.randrange(8)
    elif kind == 2:  # truncate
        frame = frame[: rng.randrange(len(frame) + 1)]
    elif kind == 3:  # insert bytes
        at = rng.randrange(len(frame) + 1)
        frame[at:at] = rng.randbytes(rng.randint(1, 8))
    elif kind == 4:  # drop trailing frames
        return frames[: rng.randrange(len(frames) + 1)]
    elif kind == 5:  # add a frame
        frames.insert(rng.randrange(len(frames) + 1), rng.randbytes(rng.randint(0, 16)))
        return frames
    else:  # replace by random bytes
        frame = bytearray(rng.randbytes(rng.randint(0, 64)))
    frames[index] = bytes(frame)
    return frames


def stranger_rollout(index: int, run_id: str = "stranger-run", **overrides: object) -> Rollout:
    """A well-formed rollout nobody of the run wrote (another run, no known problem, unless overridden)."""
    fields: dict[str, object] = dict(
        rollout_id=f"stranger-{index}",
        run_id=run_id,
        group_id=f"stranger-group-{index}",
        group_size=4,
        problem_id="no-such-problem",
        split="train",
        actor_id=0,
        prompt_token_ids=np.arange(1, 6, dtype=np.int32),
        completion_token_ids=np.arange(7, 10, dtype=np.int32),
        behaviour_logprobs=np.full(3, -0.5, dtype=np.float32),
        token_versions=np.zeros(3, dtype=np.int32),
        finished=True,
        completion_text="A: 4",
        created_at=0.0,
    )
    fields.update(overrides)
    return Rollout(**fields)  # type: ignore[arg-type]


def numbered(message: Message, seq: int, stream: str = "stranger") -> list[bytes]:
    """``message`` as a socket sends it: an envelope (``stream``, ``seq``), then its frames."""
    return [bytes(frame) for frame in encode_numbered(message, Envelope(stream, seq))]


def wrong_schema_frames(rng: random.Random) -> list[bytes]:
    """Valid msgpack, not a message this socket can use: another shape, or another message type."""
    choice = rng.randrange(5)
    if choice == 0:
        return [msgspec.msgpack.encode({"type": "Rollout", "rollout_id": "x"})]  # fields missing
    if choice == 1:
        return [msgspec.msgpack.encode({"type": rng.choice(["Nope", "TrainSequence", ""]), "x": [1, 2]})]
    if choice == 2:
        return [msgspec.msgpack.encode(rng.choice([[1, 2, 3], "text", 3.5, None, {"a": {"b": {}}}]))]
    if choice == 3:  # an array frame whose dtype is not the field's
        header = msgspec.msgpack.decode(bytes(encode(stranger_rollout(0))[0]))
        header["token_versions"] = ["float32", 3]
        return [msgspec.msgpack.encode(header), *(bytes(f) for f in encode(stranger_rollout(0))[1:])]
    messages: list[Message] = [
        Shutdown(reason="stranger"),
        WeightUpdate(
            policy_version=99,
            parameter_names=["x"],
            parameter_shapes=[[10**9, 10**9]],
            parameter_dtypes=["float32"],
            samples_trained=0,
            created_at=0.0,
        ),
        TrainBatch(batch_index=0, sequences=[], micro_batches=[], created_at=0.0),
    ]
    message = rng.choice(messages)
    return [bytes(frame) for frame in encode(message)]


def damaged_frames(count: int, seed: int, first: int = 0) -> Iterator[tuple[str, list[bytes]]]:
    """``count`` (kind, frames), kinds in turn (``KINDS``): damaged (bytes changed), truncated (cut or
    frames dropped), garbage, and wrong-schema messages. Every one is refused by ``wire.decode`` or by
    a stage's checks (stranger rollouts name another run and no known problem). ``first``: the index
    of the first (a long flood is drawn in parts)."""
    rng = random.Random(f"{seed}/{first}")
    for index in range(first, first + count):
        kind = KINDS[index % len(KINDS)]
        if kind == "wrong_schema":  # past the envelope: the header is what is wrong
            yield kind, [numbered(Shutdown(reason=""), index + 1)[0], *wrong_schema_frames(rng)]
            continue
        frames = numbered(stranger_rollout(index), index + 1)
        if kind == "damaged":
            frames = mutate(frames, rng)
        elif kind == "truncated":
            cut = rng.randrange(len(frames))  # the frame cut short; those after it are lost
            frames = [*frames[:cut], frames[cut][: rng.randrange(len(frames[cut]))]]
        else:
            frames = [rng.randbytes(rng.randint(0, 256)) for _ in range(rng.randint(1, 5))]
        yield kind, frames or [b""]  # ZeroMQ has no message of zero parts


def impossible_rollouts(run_id: str, problem_ids: list[str], first: int = 0) -> dict[str, list[Rollout]]:
    """Well-formed rollouts of the run, for its problems, that it must not train or keep for ever:
    100 with impossible values (``rejected``), 200 whose groups never complete, and 4 complete groups
    of 4 with a token id outside any vocabulary (the trainer refuses those). ``first`` offsets the
    ids, so that a later call's rollouts are new ones."""
    valid: dict[str, Any] = dict(run_id=run_id, problem_id=problem_ids[0])
    impossible: list[dict[str, Any]] = [
        {"token_versions": np.array([0, 10**6, 0], dtype=np.int32)},
        {"behaviour_logprobs": np.array([-0.5, np.nan, -0.5], dtype=np.float32)},
        {"completion_token_ids": np.array([7, -1, 9], dtype=np.int32)},
        {"group_size": 256},
    ]
    return {
        "rejected": [
            stranger_rollout(first + 10**6 + i, **valid, **change) for i, change in enumerate(impossible * 25)
        ],
        "never_complete": [stranger_rollout(first + 2 * 10**6 + i, **valid) for i in range(200)],
        "outside_vocabulary": [
            stranger_rollout(
                first + 3 * 10**6 + 4 * group + member,
                run_id=run_id,
                problem_id=problem_ids[group % len(problem_ids)],
                group_id=f"stranger-oov-{first}-{group}",
                completion_token_ids=np.array([7, 10**6, 9], dtype=np.int32),
            )
            for group in range(4)
            for member in range(4)
        ],
    }
