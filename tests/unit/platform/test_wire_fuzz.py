"""``wire.decode`` under damaged input: whatever the bytes, a valid message or ``MalformedMessage``.

A seeded mutation loop (hypothesis is not a dependency) damages the frames of every message type:
bytes overwritten, bits flipped, frames truncated, bytes inserted, frames dropped or added, headers
replaced by random bytes. The cases the loop first found (strings that are not UTF-8, deep
nesting) are pinned by name below.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from pipelinerl.bench.fault_frames import mutate
from pipelinerl.platform.wire import (
    MAX_STREAM_NAME,
    MESSAGE_TYPES,
    Envelope,
    MalformedMessage,
    decode,
    decode_numbered,
    encode,
    encode_numbered,
)
from tests.unit.platform.test_wire import ALL_MESSAGES, reject

MUTATIONS_PER_RUN = 20_000


def test_damaged_frames_of_every_message_decode_or_raise_malformed_only() -> None:
    rng = random.Random(20261122)
    outcomes = {"malformed": 0, "decoded": 0}
    for _ in range(MUTATIONS_PER_RUN):
        frames = [bytes(frame) for frame in encode(rng.choice(ALL_MESSAGES))]
        for _ in range(rng.randint(1, 3)):
            frames = mutate(frames, rng)
        try:
            message = decode(frames)
        except MalformedMessage:
            outcomes["malformed"] += 1
        else:  # damage that still makes a valid message (e.g. a changed text byte) must be one
            assert isinstance(message, MESSAGE_TYPES)
            outcomes["decoded"] += 1
    assert outcomes["malformed"] > MUTATIONS_PER_RUN // 2, outcomes


@pytest.mark.parametrize(
    "header",
    [
        b"\x81\xa4type\xa2\xff\xfe",  # the tag's value is not UTF-8
        msgspec.msgpack.encode({"type": "Shutdown"})[:-1] + b"\xa2\xff\xfe",  # nor a field name
        msgspec.msgpack.encode({"type": "Shutdown", "reason": "x"}).replace(b"\xa1x", b"\xa1\xff"),
    ],
)
def test_a_string_that_is_not_utf8_is_malformed(header: bytes) -> None:
    reject([header], "not UTF-8|invalid message|not valid msgpack")


def test_maps_nested_too_deep_are_malformed() -> None:
    reject([b"\x81\xa1a" * 100_000 + b"\xc0"], "nests too deep")


def test_a_field_the_struct_does_not_declare_is_malformed() -> None:
    header = {"type": "Shutdown", "reason": "x", "extra": 2**64 - 1}
    reject([msgspec.msgpack.encode(header)], "unknown field `extra`")


def test_every_message_type_is_covered() -> None:
    assert {type(message) for message in ALL_MESSAGES} == set(MESSAGE_TYPES)


def test_damaged_numbered_frames_decode_or_raise_malformed_only() -> None:
    """The envelope in front (stream, number) is damaged too: still a valid pair or MalformedMessage."""
    rng = random.Random(20261123)
    malformed = 0
    for seq in range(1, MUTATIONS_PER_RUN // 4 + 1):
        envelope = Envelope(f"actor{rng.randrange(4)}/123/abcdef", seq)
        frames = [bytes(frame) for frame in encode_numbered(rng.choice(ALL_MESSAGES), envelope)]
        for _ in range(rng.randint(1, 3)):
            frames = mutate(frames, rng)
        try:
            decoded_envelope, message = decode_numbered(frames)
        except MalformedMessage:
            malformed += 1
        else:
            assert isinstance(decoded_envelope, Envelope) and decoded_envelope.seq >= 1
            assert isinstance(message, MESSAGE_TYPES)
    assert malformed > MUTATIONS_PER_RUN // 8


@pytest.mark.parametrize(
    ("envelope", "reason"),
    [
        (msgspec.msgpack.encode(["actor0", 0]), "Expected `int` >= 1"),
        (msgspec.msgpack.encode(["", 1]), "length >= 1"),
        (msgspec.msgpack.encode(["a" * (MAX_STREAM_NAME + 1), 1]), "length <= 128"),
        (msgspec.msgpack.encode(["actor0", 1, "extra"]), "bad envelope"),
        (msgspec.msgpack.encode({"stream": "actor0", "seq": 1}), "Expected `array`"),
        (b"\xc1", "bad envelope"),
    ],
)
def test_a_bad_envelope_is_malformed(envelope: bytes, reason: str) -> None:
    frames = [bytes(frame) for frame in encode(ALL_MESSAGES[0])]
    with pytest.raises(MalformedMessage, match=reason):
        decode_numbered([envelope, *frames])


def test_a_numbered_message_round_trips() -> None:
    for message in ALL_MESSAGES:
        envelope = Envelope("preprocessor-to-rank0/42/0a1b2c", 7)
        assert decode_numbered(encode_numbered(message, envelope)) == (envelope, message)
