"""The digest of a weight bucket (``weight_digest``), the comparison a member makes, and the message
that carries the trainer's digests (``wire.WeightDigests``)."""

from __future__ import annotations

import msgspec
import pytest
import torch
from blake3 import blake3

from pipelinerl.platform.weight_digest import DIGEST_BYTES, bucket_digest, refused_buckets, tensor_bytes
from pipelinerl.platform.wire import MalformedMessage, WeightDigests, decode, encode


def test_the_same_bytes_give_the_same_digest_and_one_flipped_bit_another() -> None:
    tensor = torch.arange(64, dtype=torch.float64)
    digest = bucket_digest([tensor])
    assert len(digest) == DIGEST_BYTES
    assert bucket_digest([tensor.clone()]) == digest
    flipped = tensor.clone()
    flipped.view(torch.uint8)[100] ^= 0b0000_0100
    assert bucket_digest([flipped]) != digest


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16, torch.float64])
def test_every_weight_dtype_is_hashed_by_its_raw_bytes(dtype: torch.dtype) -> None:
    """bfloat16 has no numpy dtype: its bytes are read through a uint8 view, two a value."""
    tensor = torch.linspace(-3, 3, 50, dtype=torch.float64).to(dtype)
    assert bytes(tensor_bytes(tensor)) == bytes(tensor.view(torch.uint8).numpy())
    assert len(tensor_bytes(tensor)) == 50 * tensor.element_size()
    changed = tensor.clone()
    changed[7] = -changed[7]
    assert bucket_digest([changed]) != bucket_digest([tensor])


def test_the_members_hashed_in_turn_give_the_flattened_buckets_digest() -> None:
    """The trainer hashes a bucket's members one after the other; the member hashes the flat buffer."""
    members = [torch.randn(4, 6, dtype=torch.float64), torch.randn(3, dtype=torch.float64)]
    flat = torch.cat([member.reshape(-1) for member in members])
    assert bucket_digest(members) == bucket_digest([flat])
    assert bucket_digest(reversed(members)) != bucket_digest([flat])


def test_a_non_contiguous_tensor_is_hashed_in_the_order_it_is_flattened() -> None:
    tensor = torch.randn(5, 7, dtype=torch.float64).t()
    assert not tensor.is_contiguous()
    assert bucket_digest([tensor]) == bucket_digest([tensor.reshape(-1)])
    assert bucket_digest([tensor]) != bucket_digest([tensor.t()])  # the storage order is not the bytes


def test_an_empty_bucket_has_the_digest_of_no_bytes() -> None:
    assert bucket_digest([torch.empty(0, 3)]) == bucket_digest([])


def test_the_digest_is_blake3_of_the_bytes_on_the_wire() -> None:
    """Any implementation on another side (a GPU kernel, another language) must give these bytes: the
    BLAKE3 of the empty input is the published test vector, and a bucket's is BLAKE3 of its bytes."""
    assert bucket_digest([]).hex() == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    tensor = torch.arange(3000, dtype=torch.float32)  # 12 kB: more than one BLAKE3 chunk of 1 KiB
    assert bucket_digest([tensor]) == blake3(tensor.numpy().tobytes()).digest()


# ----- the comparison -----


def test_the_buckets_whose_digests_differ_are_refused_and_only_they() -> None:
    received = [bucket_digest([torch.full((4,), float(k))]) for k in range(4)]
    assert refused_buckets(received, list(received)) == ([], "")
    altered = list(received)
    altered[1], altered[3] = bucket_digest([torch.ones(5)]), bytes(DIGEST_BYTES)
    refused, reason = refused_buckets(received, altered)
    assert refused == [1, 3] and "differ from the digest the trainer announced" in reason


def test_digests_that_are_not_one_per_bucket_or_never_came_refuse_every_bucket() -> None:
    received = [bucket_digest([torch.full((4,), float(k))]) for k in range(3)]
    assert refused_buckets(received, received[:2]) == ([0, 1, 2], "2 digests came for 3 buckets")
    assert refused_buckets(received, [*received, received[0]])[0] == [0, 1, 2]
    refused, reason = refused_buckets(received, None)
    assert refused == [0, 1, 2] and "did not come" in reason


# ----- the message that carries them -----


def digests_message(digests: list[bytes]) -> WeightDigests:
    return WeightDigests(policy_version=3, bucket_digests=digests)


def test_the_trainers_digests_cross_the_wire_unchanged() -> None:
    message = digests_message([bucket_digest([torch.randn(8)]) for _ in range(3)])
    assert decode(encode(message)) == message


def test_a_digest_of_the_wrong_size_is_malformed() -> None:
    frames = encode(digests_message([bytes(DIGEST_BYTES)] * 3))
    header = msgspec.msgpack.decode(frames[0])
    header["bucket_digests"][1] = b"short"
    with pytest.raises(MalformedMessage, match="bucket_digests"):
        decode([msgspec.msgpack.encode(header), *frames[1:]])
    with pytest.raises(ValueError, match="must each be 32 bytes"):
        digests_message([b"x"] * 3)
