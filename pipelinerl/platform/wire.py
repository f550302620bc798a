"""Typed wire messages between the stages: a msgpack header plus raw array frames.

Every message is one multipart ZeroMQ message:

* frame 0: the message struct encoded with msgspec msgpack. The struct's type travels as the tag
  field ``"type"`` (the class name), so frame 0 alone says which message this is. Every numeric
  array field is replaced in the header by an array descriptor ``[dtype, length]``.
* frames 1..k: the raw little-endian buffers of those arrays, one frame per array, in the order
  the header mentions them: depth first, fields in declaration order, list items in index order.
  For a ``TrainBatch`` that is ``sequences[0].prompt_token_ids``, ``sequences[0].completion_token_ids``,
  ``sequences[0].behaviour_logprobs``, ``sequences[0].token_versions``, ``sequences[1].prompt_token_ids``, ...

Invariants:

* Never pickle: the header is msgpack decoded into a closed set of struct types, and array frames
  are interpreted only as the dtypes in ``ALLOWED_DTYPES``, so a peer cannot make a receiver run
  code or allocate beyond what it sent.
* ``decode`` either returns a fully validated message or raises ``MalformedMessage``, whatever the
  bytes (nothing else escapes it: a receiver must never die of its input): unknown tag, bad
  msgpack, a string that is not UTF-8, nesting too deep, a field the struct does not declare, a
  header that is not a message struct, a frame count that does not match the
  header, a buffer whose size is not ``length * itemsize``, a dtype outside the allow-list or
  other than the field declares, or a field constraint broken (e.g. one behaviour log-prob per
  completion token). Receivers count and skip such messages and keep running.
* Array fields are declared as ``npt.NDArray[np.int32]`` / ``npt.NDArray[np.float32]``; a struct
  coerces them to 1-D contiguous arrays of exactly that dtype when built, and refuses a lossy kind
  change (floats into an int field). Decoded arrays are read-only views of the received frames.
* Equality (``==``) compares arrays by value, so ``decode(encode(m)) == m``.

On a socket a message travels numbered (``encode_numbered`` / ``decode_numbered``): one more frame
goes first, the ``Envelope`` (msgpack ``[stream, seq]``): the sending socket's stream name and the
message's number in it, 1, 2, ... A receiver uses it to see a message lost (a number skipped) or
replayed (a number not above the last one); ``transport.Receiver`` does.
"""

from __future__ import annotations

import functools
import threading
import typing
from collections.abc import Sequence
from typing import Annotated, Any, Final, TypeAlias

import msgspec
import numpy as np
import numpy.typing as npt
import zmq

from pipelinerl.platform.weight_digest import DIGEST_BYTES

# Only plain numeric dtypes may travel: these cover token ids, policy versions and log-probs, and
# refusing everything else (objects, strings, structured dtypes) keeps a frame a dumb buffer.
ALLOWED_DTYPES: Final = frozenset({"int32", "int64", "float32"})

Int32Array: TypeAlias = npt.NDArray[np.int32]
Float32Array: TypeAlias = npt.NDArray[np.float32]

NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
Digest = Annotated[bytes, msgspec.Meta(min_length=DIGEST_BYTES, max_length=DIGEST_BYTES)]
MAX_STREAM_NAME: Final = 128  # characters of an Envelope's stream name


class MalformedMessage(ValueError):
    """A multipart message that does not decode to a valid message; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ArrayDescriptor(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """What the header holds in place of an array: its dtype name and element count."""

    dtype: str
    length: NonNegativeInt


def _declared_dtype(annotation: Any) -> np.dtype[Any] | None:
    """The dtype of an ``npt.NDArray[...]`` annotation, or None for any other annotation."""
    if typing.get_origin(annotation) is not np.ndarray:
        return None
    dtype_annotation = typing.get_args(annotation)[1]  # np.dtype[np.int32]
    return np.dtype(typing.get_args(dtype_annotation)[0])


@functools.cache
def _array_fields(struct_type: type[msgspec.Struct]) -> dict[str, np.dtype[Any]]:
    """Name -> declared dtype of each array field of a struct type, in declaration order."""
    hints = typing.get_type_hints(struct_type)
    fields = {}
    for name in struct_type.__struct_fields__:
        dtype = _declared_dtype(hints[name])
        if dtype is not None:
            if dtype.name not in ALLOWED_DTYPES:
                raise TypeError(
                    f"{struct_type.__name__}.{name}: dtype {dtype.name} is not in {sorted(ALLOWED_DTYPES)}"
                )
            fields[name] = dtype
    return fields


def _as_field_array(value: Any, dtype: np.dtype[Any], where: str) -> np.ndarray:
    array = np.asarray(value)
    if array.ndim != 1:
        raise ValueError(f"{where}: expected a 1-D array, got shape {array.shape}")
    if array.size > 0 and not np.can_cast(array.dtype, dtype, casting="same_kind"):
        raise TypeError(f"{where}: cannot store {array.dtype} values in a {dtype.name} field")
    return np.ascontiguousarray(array, dtype=dtype)


def _values_equal(left: Any, right: Any) -> bool:
    if isinstance(left, np.ndarray) or isinstance(right, np.ndarray):
        return (
            isinstance(left, np.ndarray)
            and isinstance(right, np.ndarray)
            and left.dtype == right.dtype
            and bool(np.array_equal(left, right, equal_nan=left.dtype.kind == "f"))
        )
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(_values_equal(a, b) for a, b in zip(left, right, strict=True))
    return bool(left == right)


class WireStruct(msgspec.Struct, forbid_unknown_fields=True):
    """Base of every struct on the wire: array fields are validated when built and compared by value.

    A field the struct does not declare is refused, not skipped: a header is the stage's own schema
    or it is malformed (the stages of a run run the same code)."""

    def __post_init__(self) -> None:
        struct_type = type(self)
        for name, dtype in _array_fields(struct_type).items():
            setattr(self, name, _as_field_array(getattr(self, name), dtype, f"{struct_type.__name__}.{name}"))

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(
            _values_equal(getattr(self, name), getattr(other, name)) for name in self.__struct_fields__
        )


def _check_per_token(struct: Rollout | TrainSequence) -> None:
    n_tokens = len(struct.completion_token_ids)
    for name in ("behaviour_logprobs", "token_versions"):
        if len(getattr(struct, name)) != n_tokens:
            raise ValueError(
                f"{type(struct).__name__}.{name} has {len(getattr(struct, name))} entries; "
                f"expected one per completion token ({n_tokens})"
            )


class Rollout(WireStruct, tag=True):
    """Actor -> preprocessor: one finished sequence."""

    rollout_id: str  # unique (uuid4 hex); the trainer's ledger consumes each at most once
    run_id: str
    group_id: str  # the G samples of one prompt share it
    group_size: Annotated[int, msgspec.Meta(ge=1)]
    problem_id: str
    split: str  # "train" or "eval"
    actor_id: NonNegativeInt
    prompt_token_ids: Int32Array
    completion_token_ids: Int32Array
    behaviour_logprobs: Float32Array  # one per completion token
    token_versions: Int32Array  # policy version that sampled each completion token
    finished: bool  # ended with EOS (False: hit max_new_tokens)
    completion_text: str
    created_at: float  # time.time() when finished

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_per_token(self)


class TrainSequence(WireStruct):
    """One sequence inside a ``TrainBatch`` (not a message on its own, so it carries no tag)."""

    rollout_id: str
    group_id: str
    prompt_token_ids: Int32Array
    completion_token_ids: Int32Array
    behaviour_logprobs: Float32Array
    token_versions: Int32Array
    reward: float
    advantage: float
    finished: bool

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_per_token(self)


class TrainBatch(WireStruct, tag=True):
    """Preprocessor -> trainer: the data of one optimizer step."""

    batch_index: NonNegativeInt
    sequences: list[TrainSequence]
    micro_batches: list[list[int]]  # indices into sequences
    created_at: float

    def __post_init__(self) -> None:
        super().__post_init__()
        n_sequences = len(self.sequences)
        # Each sequence in exactly one non-empty micro-batch: a repeated index would train a sequence
        # twice in one step, a missing one would count it in the loss's normaliser without training it.
        seen: set[int] = set()
        for micro_batch in self.micro_batches:
            if not micro_batch:
                raise ValueError("TrainBatch.micro_batches holds an empty micro-batch")
            for index in micro_batch:
                if not 0 <= index < n_sequences:
                    raise ValueError(
                        f"TrainBatch.micro_batches index {index} is outside 0..{n_sequences - 1} "
                        f"({n_sequences} sequences)"
                    )
                if index in seen:
                    raise ValueError(f"TrainBatch.micro_batches holds sequence {index} twice")
                seen.add(index)
        if len(seen) != n_sequences:
            raise ValueError(
                f"TrainBatch.micro_batches leave {n_sequences - len(seen)} of its {n_sequences} sequences out"
            )


class WeightUpdate(WireStruct, tag=True):
    """Trainer -> actors (PUB/SUB notice); the tensors follow by torch.distributed broadcast, then
    ``WeightDigests`` of this version."""

    policy_version: NonNegativeInt
    parameter_names: list[str]
    parameter_shapes: list[list[int]]
    parameter_dtypes: list[str]
    samples_trained: NonNegativeInt
    created_at: float

    def __post_init__(self) -> None:
        n_parameters = len(self.parameter_names)
        if not len(self.parameter_shapes) == len(self.parameter_dtypes) == n_parameters:
            raise ValueError(
                f"WeightUpdate lists {n_parameters} names, {len(self.parameter_shapes)} shapes and "
                f"{len(self.parameter_dtypes)} dtypes; they must be equal"
            )


class WeightDigests(WireStruct, tag=True):
    """Trainer -> actors (PUB/SUB notice), right after the broadcast of update ``policy_version``:
    the digest of every bucket it carried (``weight_digest``), in the order of the group's bucket
    plan, so an actor can tell bytes injected into the unauthenticated collective from the trainer's
    before it loads any. How many there must be is the actor's to check against what it received
    (``weight_digest.refused_buckets``)."""

    policy_version: NonNegativeInt
    bucket_digests: list[Digest]

    def __post_init__(self) -> None:
        if any(len(digest) != DIGEST_BYTES for digest in self.bucket_digests):  # msgspec checks decoding
            raise ValueError(f"WeightDigests.bucket_digests must each be {DIGEST_BYTES} bytes")


class Shutdown(WireStruct, tag=True):
    """Any -> any: stop cleanly."""

    reason: str


# A log-prob is at most 0; this much above it is rounding, more is a probability above 1.
LOGPROB_TOLERANCE: Final = 1e-3


def impossible_values(
    sequence: Rollout | TrainSequence,
    *,
    newest_version: int | None = None,
    vocab_size: int | None = None,
    max_completion_tokens: int | None = None,
    max_sequence_tokens: int | None = None,
) -> str | None:
    """Why a well-formed ``sequence`` cannot be trained, or None: what a schema cannot say.

    An empty prompt (the first completion token is predicted from the last prompt token, so a
    sequence without one has nothing to condition on: it crashed the packer and the loss); a
    completion longer than ``max_completion_tokens`` (given: ``actor.max_new_tokens``, which no actor
    exceeds) or a sequence longer than ``max_sequence_tokens`` (given: the model's positions); a token
    id below 0 or at/above ``vocab_size`` (given); a policy version below 0 or above
    ``newest_version`` (given: no weights newer than the trainer's can have sampled a token); a
    behaviour log-prob that is not finite or above 0; a reward or advantage that is not finite. The
    receiving stage checks this at its boundary and rejects (counts) the sequence: such values would
    otherwise reach the trainer's embedding lookup, its loss and its statistics. An empty completion
    (an actor that sampled end-of-sequence first, its token not kept) is possible and allowed.
    """
    n_prompt, n_completion = len(sequence.prompt_token_ids), len(sequence.completion_token_ids)
    if n_prompt == 0:
        return "prompt_token_ids is empty: a sequence needs at least one prompt token"
    if max_completion_tokens is not None and n_completion > max_completion_tokens:
        return (
            f"the completion has {n_completion} tokens, more than the {max_completion_tokens} an actor writes"
        )
    if max_sequence_tokens is not None and n_prompt + n_completion > max_sequence_tokens:
        return (
            f"prompt and completion take {n_prompt} + {n_completion} tokens, more than the model's "
            f"{max_sequence_tokens} positions"
        )
    for name in ("prompt_token_ids", "completion_token_ids"):
        ids = getattr(sequence, name)
        if len(ids) and int(ids.min()) < 0:
            return f"{name} holds {int(ids.min())} < 0"
        if vocab_size is not None and len(ids) and int(ids.max()) >= vocab_size:
            return f"{name} holds {int(ids.max())}, outside the vocabulary of {vocab_size}"
    versions = sequence.token_versions
    if len(versions) and int(versions.min()) < 0:
        return f"token_versions holds {int(versions.min())} < 0"
    if newest_version is not None and len(versions) and int(versions.max()) > newest_version:
        return f"token_versions holds {int(versions.max())}, newer than the newest policy v{newest_version}"
    logprobs = sequence.behaviour_logprobs
    if not bool(np.isfinite(logprobs).all()):
        return "behaviour_logprobs holds a value that is not finite"
    if len(logprobs) and float(logprobs.max()) > LOGPROB_TOLERANCE:
        return f"behaviour_logprobs holds {float(logprobs.max())} > 0 (a probability above 1)"
    if isinstance(sequence, TrainSequence) and not np.isfinite([sequence.reward, sequence.advantage]).all():
        return f"reward {sequence.reward} or advantage {sequence.advantage} is not finite"
    return None


Message: TypeAlias = Rollout | TrainBatch | WeightUpdate | WeightDigests | Shutdown
MESSAGE_TYPES: Final = (Rollout, TrainBatch, WeightUpdate, WeightDigests, Shutdown)

Frame: TypeAlias = bytes | memoryview | zmq.Frame


class _FrameCursor:
    """The array frames of one message being decoded, handed out in the order the header names them."""

    def __init__(self, buffers: list[memoryview]) -> None:
        self.buffers = buffers
        self.position = 0

    def array_for(self, annotation: Any, descriptor_value: Any) -> np.ndarray:
        declared = _declared_dtype(annotation)
        if declared is None:
            raise MalformedMessage(f"no wire type for {annotation!r}")
        try:
            descriptor = msgspec.convert(descriptor_value, ArrayDescriptor)
        except msgspec.ValidationError as error:
            raise MalformedMessage(f"bad array descriptor {descriptor_value!r}: {error}") from error
        if descriptor.dtype not in ALLOWED_DTYPES:
            raise MalformedMessage(f"dtype {descriptor.dtype!r} is not one of {sorted(ALLOWED_DTYPES)}")
        if descriptor.dtype != declared.name:
            raise MalformedMessage(f"dtype {descriptor.dtype!r} where the field declares {declared.name!r}")
        if self.position >= len(self.buffers):
            raise MalformedMessage(
                f"missing frame: the header describes more arrays than the {len(self.buffers)} frames sent"
            )
        buffer = self.buffers[self.position]
        self.position += 1
        dtype = declared.newbyteorder("<")
        if buffer.nbytes != descriptor.length * dtype.itemsize:
            raise MalformedMessage(
                f"frame {self.position} has {buffer.nbytes} bytes; expected {descriptor.length} x "
                f"{descriptor.dtype} = {descriptor.length * dtype.itemsize}"
            )
        return np.frombuffer(buffer, dtype=dtype)


# The hooks below are bound once to a shared encoder/decoder (building one per call costs ~7 us, more
# than decoding a small message), so the buffers of the message in progress live in a thread-local.
_in_progress = threading.local()


def _describe_array(value: Any) -> Any:
    if isinstance(value, np.generic):  # a numpy scalar (e.g. a reward computed with numpy) as a Python one
        return value.item()
    if not isinstance(value, np.ndarray):
        # msgspec's enc_hook protocol: this exception means "unsupported type" (msgspec raises TypeError).
        raise NotImplementedError(f"{type(value).__name__} cannot travel on the wire")
    if value.dtype.name not in ALLOWED_DTYPES or value.ndim != 1:
        raise TypeError(
            f"only 1-D arrays of {sorted(ALLOWED_DTYPES)} travel; got {value.dtype} {value.shape}"
        )
    array = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
    _in_progress.buffers.append(array.data.cast("B"))
    return ArrayDescriptor(value.dtype.name, len(array))


def _array_from_frame(annotation: Any, value: Any) -> Any:
    cursor: _FrameCursor = _in_progress.cursor
    return cursor.array_for(annotation, value)


class Envelope(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """Frame 0 of a message on a socket: the sender's stream and the message's number in it.

    ``stream`` names one sending socket for its lifetime (a restarted stage sends a new stream), so
    its numbers run 1, 2, 3, ... without gaps unless a message was lost on the way."""

    stream: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_STREAM_NAME)]
    seq: Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]


_ENVELOPE_ENCODER: Final = msgspec.msgpack.Encoder()
_ENVELOPE_DECODER: Final = msgspec.msgpack.Decoder(Envelope)
_HEADER_ENCODER: Final = msgspec.msgpack.Encoder(enc_hook=_describe_array)
_HEADER_DECODER: Final = msgspec.msgpack.Decoder(Message, dec_hook=_array_from_frame)


def encode(message: Message) -> list[bytes | memoryview]:
    """The frames of ``message``: its msgpack header, then one raw buffer per array field."""
    if not isinstance(message, MESSAGE_TYPES):
        raise TypeError(
            f"expected one of {[t.__name__ for t in MESSAGE_TYPES]}, got {type(message).__name__}"
        )
    buffers: list[memoryview] = []
    _in_progress.buffers = buffers
    try:
        header = _HEADER_ENCODER.encode(message)
    finally:
        del _in_progress.buffers
    return [header, *buffers]


def _as_buffer(frame: Frame) -> memoryview:
    if isinstance(frame, zmq.Frame):
        return frame.buffer
    return memoryview(frame)


def decode(frames: Sequence[Frame]) -> Message:
    """The message in ``frames`` (as ``encode`` made them); raises ``MalformedMessage`` otherwise."""
    if len(frames) == 0:
        raise MalformedMessage("no frames")
    try:
        buffers = [_as_buffer(frame) for frame in frames]
    except TypeError as error:
        raise MalformedMessage(f"a frame is not a buffer: {error}") from error
    cursor = _FrameCursor(buffers[1:])
    _in_progress.cursor = cursor
    try:
        message = _HEADER_DECODER.decode(buffers[0])
    except msgspec.ValidationError as error:  # also wraps what the frame hook and __post_init__ raise
        raise MalformedMessage(f"invalid message: {error}") from error
    except msgspec.DecodeError as error:
        raise MalformedMessage(f"frame 0 is not valid msgpack: {error}") from error
    except UnicodeDecodeError as error:  # msgspec raises it, unwrapped, for a str that is not UTF-8
        raise MalformedMessage(f"frame 0 holds a string that is not UTF-8: {error}") from error
    except RecursionError as error:  # msgspec's depth limit, e.g. maps nested 10^5 deep
        raise MalformedMessage(f"frame 0 nests too deep: {error}") from error
    except Exception as error:
        # The contract receivers rely on: whatever else a damaged frame trips, it is a rejection,
        # never a dead stage. A cause found here deserves its own clause above.
        raise MalformedMessage(f"undecodable ({type(error).__name__}): {error}") from error
    finally:
        del _in_progress.cursor
    if cursor.position != len(cursor.buffers):
        raise MalformedMessage(
            f"extra frame: the header describes {cursor.position} arrays but {len(cursor.buffers)} "
            "array frames were sent"
        )
    return message


def encode_numbered(message: Message, envelope: Envelope) -> list[bytes | memoryview]:
    """The frames of ``message`` as a socket sends it: the envelope, then ``encode(message)``."""
    return [_ENVELOPE_ENCODER.encode(envelope), *encode(message)]


def decode_numbered(frames: Sequence[Frame]) -> tuple[Envelope, Message]:
    """The envelope and message in ``frames`` (as ``encode_numbered`` made them); raises
    ``MalformedMessage`` otherwise, whatever the bytes."""
    if len(frames) < 2:
        raise MalformedMessage(f"{len(frames)} frame(s): a numbered message has an envelope and a header")
    try:
        envelope = _ENVELOPE_DECODER.decode(_as_buffer(frames[0]))
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        raise MalformedMessage(f"bad envelope: {error}") from error
    except Exception as error:  # as in decode: a damaged envelope is a rejection, never a dead stage
        raise MalformedMessage(f"undecodable envelope ({type(error).__name__}): {error}") from error
    return envelope, decode(frames[1:])
