"""Wire messages: round trips of every type, construction checks, and every malformation decode rejects."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest
import zmq

from pipelinerl.platform.wire import (
    ALLOWED_DTYPES,
    MalformedMessage,
    Message,
    Rollout,
    Shutdown,
    TrainBatch,
    TrainSequence,
    WeightDigests,
    WeightUpdate,
    decode,
    encode,
)


def make_rollout(**overrides: Any) -> Rollout:
    fields: dict[str, Any] = dict(
        rollout_id="0f" * 16,
        run_id="run-1",
        group_id="group-7",
        group_size=4,
        problem_id="gsm8k/12",
        split="train",
        actor_id=1,
        prompt_token_ids=np.array([101, 7, 2**31 - 1], dtype=np.int32),
        completion_token_ids=np.array([5, 6, 0], dtype=np.int32),
        behaviour_logprobs=np.array([-0.25, -1.5, -3.0e-8], dtype=np.float32),
        token_versions=np.array([3, 3, 4], dtype=np.int32),
        finished=True,
        completion_text="x = 4 ✓ — naïve 答案 🚀",
        created_at=1_700_000_000.25,
    )
    fields.update(overrides)
    return Rollout(**fields)


def make_sequence(index: int, n_completion: int) -> TrainSequence:
    return TrainSequence(
        rollout_id=f"rollout-{index}",
        group_id="group-1",
        prompt_token_ids=np.arange(index, index + 3, dtype=np.int32),
        completion_token_ids=np.arange(100 + index, 100 + index + n_completion, dtype=np.int32),
        behaviour_logprobs=-np.linspace(0.1, 1.0, n_completion, dtype=np.float32),
        token_versions=np.full(n_completion, index, dtype=np.int32),
        reward=float(index),
        advantage=index - 0.5,
        finished=index % 2 == 0,
    )


def make_batch() -> TrainBatch:
    sequences = [make_sequence(0, 2), make_sequence(1, 0), make_sequence(2, 5)]
    return TrainBatch(batch_index=9, sequences=sequences, micro_batches=[[0, 2], [1]], created_at=12.5)


def make_weight_update() -> WeightUpdate:
    return WeightUpdate(
        policy_version=17,
        parameter_names=["embed.weight", "layers.0.ln.bias"],
        parameter_shapes=[[32000, 64], [64]],
        parameter_dtypes=["bfloat16", "float32"],
        samples_trained=4096,
        created_at=3.5,
    )


ALL_MESSAGES: list[Message] = [
    make_rollout(),
    make_rollout(
        completion_token_ids=np.array([], dtype=np.int32),
        behaviour_logprobs=np.array([], dtype=np.float32),
        token_versions=np.array([], dtype=np.int32),
        prompt_token_ids=np.array([], dtype=np.int32),
        completion_text="",
        finished=False,
        split="eval",
    ),
    make_batch(),
    TrainBatch(batch_index=0, sequences=[], micro_batches=[], created_at=0.0),
    make_weight_update(),
    WeightUpdate(
        policy_version=0,
        parameter_names=[],
        parameter_shapes=[],
        parameter_dtypes=[],
        samples_trained=0,
        created_at=0.0,
    ),
    WeightDigests(policy_version=7, bucket_digests=[bytes(range(32)), bytes(32)]),
    WeightDigests(policy_version=0, bucket_digests=[]),
    Shutdown(reason="trainer finished: 100 steps ✓"),
    Shutdown(reason=""),
]


def header_of(frames: list[bytes | memoryview]) -> Any:
    return msgspec.msgpack.decode(frames[0])


def with_header(frames: list[bytes | memoryview], header: Any) -> list[bytes | memoryview]:
    return [msgspec.msgpack.encode(header), *frames[1:]]


# --- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("message", ALL_MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip_preserves_every_field(message: Message) -> None:
    decoded = decode(encode(message))
    assert type(decoded) is type(message)
    assert decoded == message


@pytest.mark.parametrize("message", ALL_MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip_through_copied_bytes_and_zmq_frames(message: Message) -> None:
    frames = encode(message)
    assert decode([bytes(frame) for frame in frames]) == message
    assert decode([zmq.Frame(bytes(frame)) for frame in frames]) == message


def test_rollout_fields_keep_values_dtypes_and_unicode() -> None:
    rollout = make_rollout()
    decoded = decode([bytes(frame) for frame in encode(rollout)])
    assert isinstance(decoded, Rollout)
    assert decoded.completion_text == "x = 4 ✓ — naïve 答案 🚀"
    assert decoded.prompt_token_ids.dtype == np.int32
    assert decoded.prompt_token_ids.tolist() == [101, 7, 2**31 - 1]
    assert decoded.behaviour_logprobs.dtype == np.float32
    assert decoded.behaviour_logprobs.tolist() == rollout.behaviour_logprobs.tolist()
    assert decoded.token_versions.tolist() == [3, 3, 4]
    assert decoded.created_at == 1_700_000_000.25
    assert decoded.finished is True


def test_arrays_travel_as_raw_little_endian_frames_not_in_the_header() -> None:
    rollout = make_rollout()
    frames = encode(rollout)
    assert len(frames) == 5
    header = header_of(frames)
    assert header["type"] == "Rollout"
    assert header["prompt_token_ids"] == ["int32", 3]
    assert header["behaviour_logprobs"] == ["float32", 3]
    assert bytes(frames[1]) == rollout.prompt_token_ids.astype("<i4").tobytes()
    assert bytes(frames[2]) == rollout.completion_token_ids.astype("<i4").tobytes()
    assert bytes(frames[3]) == rollout.behaviour_logprobs.astype("<f4").tobytes()
    assert bytes(frames[4]) == rollout.token_versions.astype("<i4").tobytes()


def test_nested_sequence_arrays_are_frames_in_depth_first_field_order() -> None:
    batch = make_batch()
    frames = encode(batch)
    expected = [
        array
        for sequence in batch.sequences
        for array in (
            sequence.prompt_token_ids,
            sequence.completion_token_ids,
            sequence.behaviour_logprobs,
            sequence.token_versions,
        )
    ]
    assert len(frames) == 1 + len(expected) == 13
    for frame, array in zip(frames[1:], expected, strict=True):
        assert bytes(frame) == array.tobytes()
    assert "type" not in header_of(frames)["sequences"][0]  # nested structs carry no tag
    decoded = decode(frames)
    assert isinstance(decoded, TrainBatch)
    assert [len(s.completion_token_ids) for s in decoded.sequences] == [2, 0, 5]
    assert decoded.micro_batches == [[0, 2], [1]]


def test_decoded_arrays_from_bytes_are_read_only_views() -> None:
    decoded = decode([bytes(frame) for frame in encode(make_rollout())])
    assert isinstance(decoded, Rollout)
    assert not decoded.prompt_token_ids.flags.writeable


# --- construction ----------------------------------------------------------------------------


def test_construction_coerces_lists_and_safe_casts_to_the_declared_dtype() -> None:
    rollout = make_rollout(
        prompt_token_ids=[],  # an empty list has no dtype to check
        completion_token_ids=np.array([3, 4], dtype=np.int64),
        behaviour_logprobs=np.array([-0.5, -0.25], dtype=np.float64),
        token_versions=[7, 8],
    )
    assert rollout.prompt_token_ids.dtype == np.int32
    assert rollout.token_versions.dtype == np.int32
    assert rollout.completion_token_ids.dtype == np.int32
    assert rollout.behaviour_logprobs.dtype == np.float32
    assert rollout.prompt_token_ids.tolist() == []
    assert rollout.token_versions.tolist() == [7, 8]
    assert rollout.completion_token_ids.tolist() == [3, 4]
    assert rollout.behaviour_logprobs.tolist() == [-0.5, -0.25]


def test_construction_rejects_floats_in_an_int_field() -> None:
    with pytest.raises(TypeError, match=r"Rollout.prompt_token_ids.*float64.*int32"):
        make_rollout(prompt_token_ids=np.array([1.5, 2.0]))


def test_construction_rejects_a_2d_array() -> None:
    with pytest.raises(ValueError, match=r"Rollout.prompt_token_ids.*1-D.*\(2, 2\)"):
        make_rollout(prompt_token_ids=np.zeros((2, 2), dtype=np.int32))


@pytest.mark.parametrize("field", ["behaviour_logprobs", "token_versions"])
def test_construction_requires_one_entry_per_completion_token(field: str) -> None:
    with pytest.raises(ValueError, match=f"{field} has 2 entries; expected one per completion token \\(3\\)"):
        make_rollout(**{field: np.zeros(2, dtype=np.float32 if field == "behaviour_logprobs" else np.int32)})


def test_construction_rejects_micro_batch_indices_outside_the_sequences() -> None:
    with pytest.raises(ValueError, match=r"index 3 is outside 0\.\.2"):
        TrainBatch(batch_index=0, sequences=make_batch().sequences, micro_batches=[[0, 3]], created_at=0.0)


def test_construction_rejects_weight_update_lists_of_different_lengths() -> None:
    with pytest.raises(ValueError, match="2 names, 1 shapes and 2 dtypes"):
        WeightUpdate(
            policy_version=1,
            parameter_names=["a", "b"],
            parameter_shapes=[[1]],
            parameter_dtypes=["float32", "float32"],
            samples_trained=0,
            created_at=0.0,
        )


def test_numpy_scalars_are_encoded_as_python_numbers() -> None:
    sequence = make_sequence(0, 1)
    sequence.reward = np.float64(0.75)  # type: ignore[assignment]
    batch = TrainBatch(
        batch_index=np.int64(2),  # type: ignore[arg-type]
        sequences=[sequence],
        micro_batches=[[np.int64(0)]],  # type: ignore[list-item]
        created_at=np.float32(1.5),  # type: ignore[arg-type]
    )
    decoded = decode(encode(batch))
    assert isinstance(decoded, TrainBatch)
    assert decoded.sequences[0].reward == 0.75
    assert decoded.batch_index == 2
    assert decoded.micro_batches == [[0]]


def test_encode_rejects_what_is_not_a_message() -> None:
    with pytest.raises(TypeError, match="TrainSequence"):
        encode(make_sequence(0, 1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dict"):
        encode({"type": "Shutdown", "reason": "x"})  # type: ignore[arg-type]


def test_encode_rejects_an_array_field_replaced_by_a_disallowed_dtype() -> None:
    rollout = make_rollout()
    rollout.prompt_token_ids = np.array([1.0], dtype=np.float64)
    with pytest.raises(TypeError, match="float64"):
        encode(rollout)


def test_equality_compares_arrays_by_value_and_dtype() -> None:
    assert make_rollout() == make_rollout()
    assert make_rollout() != make_rollout(completion_text="other")
    assert make_rollout() != make_rollout(prompt_token_ids=np.array([101, 7, 8], dtype=np.int32))
    assert make_rollout() != Shutdown(reason="x")
    nan_logprobs = np.array([np.nan, -1.0, -2.0], dtype=np.float32)
    assert make_rollout(behaviour_logprobs=nan_logprobs) == make_rollout(behaviour_logprobs=nan_logprobs)


def test_allowed_dtypes_are_the_documented_ones() -> None:
    assert sorted(ALLOWED_DTYPES) == ["float32", "int32", "int64"]
    assert issubclass(MalformedMessage, ValueError)


# --- malformations ---------------------------------------------------------------------------


def reject(frames: Any, reason_pattern: str) -> None:
    with pytest.raises(MalformedMessage, match=reason_pattern) as raised:
        decode(frames)
    assert raised.value.reason == str(raised.value)


def test_rejects_no_frames() -> None:
    reject([], "no frames")


def test_rejects_bad_msgpack() -> None:
    reject([b"\xc1"], "not valid msgpack: .*malformed")
    reject([b"\x81\xa4type"], "not valid msgpack: .*truncated")  # a map of one key and no value
    reject([b""], "not valid msgpack")


def test_rejects_an_unknown_tag() -> None:
    reject(
        [msgspec.msgpack.encode({"type": "DeleteEverything", "reason": "x"})],
        "Invalid value 'DeleteEverything'",
    )


def test_rejects_a_nested_struct_name_as_tag() -> None:
    frames = encode(make_rollout())
    header = header_of(frames)
    header["type"] = "TrainSequence"
    reject(with_header(frames, header), "Invalid value 'TrainSequence'")


@pytest.mark.parametrize(
    "header",
    [42, "Shutdown", ["Shutdown", "x"], None, {"reason": "missing tag"}, b"bytes"],
    ids=["int", "str", "list", "nil", "map-without-tag", "bin"],
)
def test_rejects_a_header_that_is_not_a_message_struct(header: Any) -> None:
    reject([msgspec.msgpack.encode(header)], "invalid message")


def test_rejects_a_missing_field_and_a_field_of_the_wrong_type() -> None:
    reject([msgspec.msgpack.encode({"type": "Shutdown"})], "missing required field `reason`")
    frames = encode(make_rollout())
    header = header_of(frames)
    header["group_size"] = "four"
    reject(with_header(frames, header), r"Expected `int`, got `str` - at `\$.group_size`")


def test_rejects_a_broken_field_constraint() -> None:
    frames = encode(make_rollout())
    header = header_of(frames)
    header["group_size"] = 0
    reject(with_header(frames, header), r"group_size")


def test_rejects_a_missing_frame() -> None:
    frames = encode(make_rollout())
    reject(frames[:-1], "missing frame")
    reject(frames[:1], "missing frame")
    batch_frames = encode(make_batch())
    reject(batch_frames[:-1], "missing frame")


def test_rejects_an_extra_frame() -> None:
    reject([*encode(make_rollout()), b"\x00\x00\x00\x00"], "extra frame")
    reject([*encode(Shutdown(reason="x")), b""], "extra frame")


@pytest.mark.parametrize("size_change", [-1, 1, -4, 4])
def test_rejects_a_buffer_of_the_wrong_size(size_change: int) -> None:
    frames = encode(make_rollout())
    original = bytes(frames[2])
    resized = original[:size_change] if size_change < 0 else original + b"\x00" * size_change
    reject([*frames[:2], resized, *frames[3:]], f"frame 2 has {len(resized)} bytes; expected 3 x int32 = 12")


def test_rejects_a_length_that_does_not_match_the_buffer() -> None:
    frames = encode(make_rollout())
    header = header_of(frames)
    header["prompt_token_ids"] = ["int32", 4]
    reject(with_header(frames, header), "expected 4 x int32 = 16")


@pytest.mark.parametrize("dtype", ["float64", "object", "<U8", "V16", "int8", ""])
def test_rejects_a_dtype_outside_the_allow_list(dtype: str) -> None:
    frames = encode(make_rollout())
    header = header_of(frames)
    header["prompt_token_ids"] = [dtype, 3]
    reject(with_header(frames, header), "is not one of")


@pytest.mark.parametrize(("field", "dtype"), [("prompt_token_ids", "int64"), ("behaviour_logprobs", "int32")])
def test_rejects_an_allowed_dtype_other_than_the_field_declares(field: str, dtype: str) -> None:
    frames = encode(make_rollout())
    header = header_of(frames)
    header[field] = [dtype, 3]
    reject(with_header(frames, header), "where the field declares")


@pytest.mark.parametrize(
    "descriptor",
    [["int32", -1], ["int32"], ["int32", 3, "extra"], {"dtype": "int32", "length": 3}, 3, "int32"],
    ids=["negative-length", "short", "long", "map", "int", "str"],
)
def test_rejects_a_malformed_array_descriptor(descriptor: Any) -> None:
    frames = encode(make_rollout())
    header = header_of(frames)
    header["prompt_token_ids"] = descriptor
    reject(with_header(frames, header), r"invalid message: bad array descriptor.*prompt_token_ids")


def test_rejects_arrays_that_break_the_per_token_invariant() -> None:
    frames = encode(make_rollout())
    header = header_of(frames)
    header["token_versions"] = ["int32", 2]
    reject([*with_header(frames, header)[:4], frames[4][:8]], "one per completion token")


def test_rejects_micro_batch_indices_outside_the_batch() -> None:
    frames = encode(make_batch())
    header = header_of(frames)
    header["micro_batches"] = [[0, 1, 2, 3]]
    reject(with_header(frames, header), "index 3 is outside")


def test_rejects_a_frame_that_is_not_a_buffer() -> None:
    reject([encode(Shutdown(reason="x"))[0], "text"], "not a buffer")
