"""Batch records (``platform/batch_records.py``): the batch a step trained reads back equal, and a
record that is not exactly that is refused naming the file and the fault."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest

from pipelinerl.platform.batch_records import (
    MAGIC,
    BatchRecordError,
    batch_record_path,
    decode_batch_record,
    encode_batch_record,
    read_batch_record,
    trained_subset,
    write_batch_record,
)
from pipelinerl.platform.wire import Shutdown, TrainBatch, TrainSequence, encode


def sequence(n: int, completion: int) -> TrainSequence:
    rng = np.random.default_rng(n)
    return TrainSequence(
        rollout_id=f"r{n}",
        group_id=f"g{n // 2}",
        prompt_token_ids=rng.integers(0, 50, size=3 + n).astype(np.int32),
        completion_token_ids=rng.integers(0, 50, size=completion).astype(np.int32),
        behaviour_logprobs=-rng.random(completion).astype(np.float32),
        token_versions=np.full(completion, n % 3, dtype=np.int32),
        reward=float(n),
        advantage=0.5 - n,
        finished=n % 2 == 0,
    )


def batch() -> TrainBatch:
    return TrainBatch(
        batch_index=7,
        sequences=[sequence(n, 2 + n) for n in range(4)],
        micro_batches=[[0, 2], [1], [3]],
        created_at=123.5,
    )


def with_digest(body: bytes) -> bytes:
    return body + hashlib.blake2b(body, digest_size=32).digest()


def frames_record(frames: list[bytes]) -> bytes:
    body = MAGIC + struct.pack("<I", len(frames))
    for frame in frames:
        body += struct.pack("<Q", len(frame)) + frame
    return with_digest(body)


def test_a_batch_reads_back_equal_from_its_step_s_file(tmp_path: Path) -> None:
    path = batch_record_path(tmp_path, 12, 1)
    assert path == tmp_path / "batches" / "step_000012_rank1.batch"
    size = write_batch_record(path, batch())
    assert size == path.stat().st_size
    assert read_batch_record(path) == batch()
    assert list(path.parent.iterdir()) == [path], "no temporary file left behind"


def test_the_trained_subset_renumbers_the_micro_batches_and_drops_emptied_ones() -> None:
    whole = batch()
    kept = [whole.sequences[0], whole.sequences[1], whole.sequences[3]]  # sequence 2 was refused
    subset = trained_subset(whole, kept)
    assert [s.rollout_id for s in subset.sequences] == ["r0", "r1", "r3"]
    assert subset.micro_batches == [[0], [1], [2]]
    assert trained_subset(whole, [whole.sequences[2]]).micro_batches == [[0]]
    assert trained_subset(whole, whole.sequences) is whole
    assert trained_subset(whole, []).sequences == []


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: b"PK\x03\x04" + data[4:], "is not a batch record"),
        (lambda data: data[: len(MAGIC) + 10], "cut short"),
        (lambda data: data[:-1], "does not match its digest"),
        (lambda data: data[:100] + bytes([data[100] ^ 1]) + data[101:], "does not match its digest"),
        (lambda data: with_digest(data[:-32] + b"tail"), "bytes after its last frame"),
        (
            lambda data: with_digest(data[: len(MAGIC)] + struct.pack("<I", 99) + data[len(MAGIC) + 4 : -32]),
            "ends inside",
        ),
    ],
    ids=["not-a-record", "short", "truncated", "flipped-bit", "trailing-bytes", "wrong-frame-count"],
)
def test_a_damaged_record_is_refused_naming_the_file_and_the_fault(tmp_path: Path, damage, message) -> None:
    path = tmp_path / "step_000001_rank0.batch"
    path.write_bytes(damage(encode_batch_record(batch())))
    with pytest.raises(BatchRecordError, match=message) as error:
        read_batch_record(path)
    assert str(path) in str(error.value)


def test_a_record_of_another_message_or_of_an_impossible_batch_is_refused() -> None:
    with pytest.raises(BatchRecordError, match="holds a Shutdown, not a TrainBatch"):
        decode_batch_record(frames_record([bytes(f) for f in encode(Shutdown(reason="done"))]), "x")
    frames = [bytes(f) for f in encode(batch())]
    frames.pop()  # one array frame missing
    with pytest.raises(BatchRecordError, match="does not hold a valid batch"):
        decode_batch_record(frames_record(frames), "x")


def test_a_missing_record_is_named(tmp_path: Path) -> None:
    with pytest.raises(BatchRecordError, match="cannot be read") as error:
        read_batch_record(tmp_path / "batches" / "step_000003_rank0.batch")
    assert "step_000003_rank0.batch" in str(error.value)
