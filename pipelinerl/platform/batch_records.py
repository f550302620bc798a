"""The exact batch each optimizer step trained on, kept in the run directory so a step can be replayed.

A trainer rank writes ``batches/step_<version>_rank<r>.batch`` after each optimizer step (with
``trainer.record_batches``): the ``TrainBatch`` it trained, as trained, i.e. after its ledger refused
rollouts already in its policy, with the micro-batch packing it used. Every field a step's loss reads
is there (prompt and completion token ids, behaviour log-probs, the version that sampled each token,
rewards, advantages); the per-token statistics beside it (``tokens/``) are what the step measured.

The file is the batch's wire encoding (``platform/wire.py``: a msgpack header, one raw buffer per
array), each frame behind its length, behind a line naming the format, and closed by a BLAKE2b
digest of everything before it. Reading it back checks all of that and the batch's own invariants,
and refuses anything else naming the file and what is wrong: a replay must never train on a batch that
is not the one the step trained.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

from pipelinerl.platform.atomic_file import write_atomically
from pipelinerl.platform.wire import MalformedMessage, TrainBatch, TrainSequence, decode, encode

BATCHES_DIR = "batches"
MAGIC = b"PIPELINERL-BATCH 1\n"
_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")
_DIGEST_BYTES = 32


class BatchRecordError(ValueError):
    """A batch record that cannot be read back as the batch a step trained."""


def batch_record_path(run_dir: Path, version: int, rank: int) -> Path:
    """Where rank ``rank`` keeps the batch of the step that made policy ``version``."""
    return run_dir / BATCHES_DIR / f"step_{version:06d}_rank{rank}.batch"


def trained_subset(batch: TrainBatch, kept: list[TrainSequence]) -> TrainBatch:
    """``batch`` with only the sequences in ``kept`` (a subset, in the batch's order), its micro-batches
    renumbered and emptied ones dropped: what a trainer trains after refusing the rest."""
    if len(kept) == len(batch.sequences):
        return batch
    index = {id(sequence): i for i, sequence in enumerate(kept)}
    old = batch.sequences
    micro_batches = [[index[id(old[i])] for i in mb if id(old[i]) in index] for mb in batch.micro_batches]
    return TrainBatch(
        batch_index=batch.batch_index,
        sequences=kept,
        micro_batches=[mb for mb in micro_batches if mb],
        created_at=batch.created_at,
    )


def encode_batch_record(batch: TrainBatch) -> bytes:
    frames = encode(batch)
    parts = [MAGIC, _COUNT.pack(len(frames))]
    for frame in frames:
        data = bytes(frame)
        parts += [_LENGTH.pack(len(data)), data]
    body = b"".join(parts)
    return body + hashlib.blake2b(body, digest_size=_DIGEST_BYTES).digest()


def write_batch_record(path: Path, batch: TrainBatch) -> int:
    """Write ``batch`` to ``path`` atomically (a reader never sees half a file); returns its bytes."""
    data = encode_batch_record(batch)
    write_atomically(path, data, make_parents=True)
    return len(data)


def decode_batch_record(data: bytes, where: str = "the batch record") -> TrainBatch:
    """The batch in ``data``; ``BatchRecordError`` naming ``where`` and the fault otherwise."""
    if not data.startswith(MAGIC):
        raise BatchRecordError(f"{where} is not a batch record (it does not start with {MAGIC!r})")
    if len(data) < len(MAGIC) + _COUNT.size + _DIGEST_BYTES:
        raise BatchRecordError(f"{where} is cut short ({len(data)} bytes)")
    body, digest = data[:-_DIGEST_BYTES], data[-_DIGEST_BYTES:]
    if hashlib.blake2b(body, digest_size=_DIGEST_BYTES).digest() != digest:
        raise BatchRecordError(f"{where} does not match its digest: it was cut short or altered")
    (count,) = _COUNT.unpack_from(body, len(MAGIC))
    offset, frames = len(MAGIC) + _COUNT.size, []
    for _ in range(count):
        if offset + _LENGTH.size > len(body):
            raise BatchRecordError(f"{where} ends inside its frame table")
        (length,) = _LENGTH.unpack_from(body, offset)
        offset += _LENGTH.size
        if offset + length > len(body):
            raise BatchRecordError(f"{where} ends inside a frame")
        frames.append(body[offset : offset + length])
        offset += length
    if offset != len(body):
        raise BatchRecordError(f"{where} has {len(body) - offset} bytes after its last frame")
    try:
        message = decode(frames)
    except MalformedMessage as error:
        raise BatchRecordError(f"{where} does not hold a valid batch: {error}") from None
    if not isinstance(message, TrainBatch):
        raise BatchRecordError(f"{where} holds a {type(message).__name__}, not a TrainBatch")
    return message


def read_batch_record(path: Path) -> TrainBatch:
    """The batch a step trained, from ``path``; ``BatchRecordError`` naming the file otherwise."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise BatchRecordError(f"{path} cannot be read: {error.strerror or error}") from None
    return decode_batch_record(data, str(path))
