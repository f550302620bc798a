"""The digest of a weight bucket (``weight_digest``) and the notice field that carries it (``wire``)."""

from __future__ import annotations

import msgspec
import pytest
import torch
from blake3 import blake3

from pipelinerl.platform.dtypes import dtype_name
from pipelinerl.platform.weight_buckets import plan_buckets
from pipelinerl.platform.weight_digest import DIGEST_BYTES, bucket_digest, digest_matches, tensor_bytes
from pipelinerl.platform.wire import MalformedMessage, WeightUpdate, decode, encode


def test_the_same_bytes_give_the_same_digest_and_one_flipped_bit_another() -> None:
    tensor = torch.arange(64, dtype=torch.float64)
    digest = bucket_digest([tensor])
    assert len(digest) == DIGEST_BYTES
    assert bucket_digest([tensor.clone()]) == digest
    flipped = tensor.clone()
    flipped.view(torch.uint8)[100] ^= 0b0000_0100
    assert bucket_digest([flipped]) != digest
    assert digest_matches(digest, tensor) and not digest_matches(digest, flipped)


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


# ----- the notice's field -----


def notice(digests: list[bytes] | None = None, bucket_bytes: int = 4096) -> WeightUpdate:
    tensors = [torch.randn(32, 32), torch.randn(32), torch.randn(8).to(torch.bfloat16)]
    shapes, dtypes = [list(t.shape) for t in tensors], [dtype_name(t) for t in tensors]
    plan = plan_buckets(shapes, dtypes, bucket_bytes)
    if digests is None:
        digests = [bucket_digest(tensors[i] for i in bucket.members) for bucket in plan]
    return WeightUpdate(
        policy_version=3,
        parameter_names=["w", "b", "h"],
        parameter_shapes=shapes,
        parameter_dtypes=dtypes,
        samples_trained=64,
        created_at=1.0,
        bucket_bytes=bucket_bytes,
        bucket_digests=digests,
    )


def test_a_notice_carries_one_digest_per_bucket_across_the_wire() -> None:
    update = notice()
    assert len(update.bucket_digests) == 3  # 4096 bytes, then 128 float32 bytes, then a bfloat16 bucket
    assert decode(encode(update)) == update


def test_a_notice_whose_digests_are_not_one_per_bucket_is_malformed() -> None:
    with pytest.raises(ValueError, match="2 bucket digests for the 3 buckets"):
        notice(digests=[bytes(DIGEST_BYTES)] * 2)
    frames = encode(notice())
    header = msgspec.msgpack.decode(frames[0])
    header["bucket_digests"] = header["bucket_digests"][:2]
    with pytest.raises(MalformedMessage, match="2 bucket digests for the 3 buckets"):
        decode([msgspec.msgpack.encode(header), *frames[1:]])


def test_a_digest_of_the_wrong_size_or_without_a_bucket_size_is_malformed() -> None:
    frames = encode(notice())
    header = msgspec.msgpack.decode(frames[0])
    header["bucket_digests"][1] = b"short"
    with pytest.raises(MalformedMessage, match="bucket_digests"):
        decode([msgspec.msgpack.encode(header), *frames[1:]])
    header = msgspec.msgpack.decode(frames[0])
    header["bucket_bytes"] = 0
    with pytest.raises(MalformedMessage, match="without the bucket size"):
        decode([msgspec.msgpack.encode(header), *frames[1:]])
    with pytest.raises(ValueError, match="must each be 32 bytes"):
        notice(digests=[b"x"] * 3)


def test_a_notice_from_before_digests_still_decodes_with_none() -> None:
    frames = encode(notice())
    header = msgspec.msgpack.decode(frames[0])
    del header["bucket_digests"], header["bucket_bytes"]
    old = decode([msgspec.msgpack.encode(header), *frames[1:]])
    assert isinstance(old, WeightUpdate) and old.bucket_digests == [] and old.bucket_bytes == 0
