"""The bucket plan of a weight update: every tensor once, in order, within the bucket size."""

import random

import pytest

from pipelinerl.platform.weight_buckets import DTYPE_BYTES, plan_buckets


def test_small_tensors_share_a_bucket_and_a_large_one_travels_alone():
    shapes = [[4], [4], [100], [2, 2], [3]]
    plan = plan_buckets(shapes, ["float32"] * 5, bucket_bytes=64)
    assert [b.members for b in plan] == [(0, 1), (2,), (3, 4)]
    assert plan[0].offsets == (0, 4) and plan[0].sizes == (4, 4) and plan[0].nbytes == 32
    assert plan[1].nbytes == 400  # larger than the bucket: alone, never split
    assert plan[2].offsets == (0, 4) and plan[2].numel == 7


def test_a_dtype_change_starts_a_new_bucket():
    plan = plan_buckets([[2], [2], [2]], ["float32", "bfloat16", "bfloat16"], bucket_bytes=1 << 20)
    assert [(b.dtype, b.members) for b in plan] == [("float32", (0,)), ("bfloat16", (1, 2))]


def test_a_bucket_exactly_full_is_closed_at_the_next_tensor():
    plan = plan_buckets([[8], [8], [1]], ["float16"] * 3, bucket_bytes=32)
    assert [b.members for b in plan] == [(0, 1), (2,)]


@pytest.mark.parametrize("seed", range(20))
def test_random_updates_are_covered_once_in_order_within_the_bucket_size(seed):
    rng = random.Random(seed)
    count = rng.randint(0, 60)
    shapes = [[rng.randint(0, 40) for _ in range(rng.randint(0, 3))] for _ in range(count)]
    dtypes = [rng.choice(sorted(DTYPE_BYTES)) for _ in range(count)]
    bucket_bytes = rng.choice([1, 16, 100, 1000, 1 << 30])
    plan = plan_buckets(shapes, dtypes, bucket_bytes)
    assert [index for bucket in plan for index in bucket.members] == list(range(count))
    for bucket in plan:
        assert all(dtypes[index] == bucket.dtype for index in bucket.members)
        assert len(bucket.members) == 1 or bucket.nbytes <= bucket_bytes
        assert bucket.offsets[0] == 0
        assert all(
            a + s == b for a, s, b in zip(bucket.offsets, bucket.sizes, bucket.offsets[1:], strict=False)
        )
    if bucket_bytes == 1 << 30 and count:  # everything fits: one bucket per run of one dtype
        runs = 1 + sum(a != b for a, b in zip(dtypes, dtypes[1:], strict=False))
        assert len(plan) == runs


@pytest.mark.parametrize(
    ("shapes", "dtypes", "bucket_bytes", "message"),
    [
        ([[2]], ["int8"], 64, "'int8' is not one of"),
        ([[2, -1]], ["float32"], 64, "negative dimension"),
        ([[2]], ["float32", "float32"], 64, "1 shapes but 2 dtypes"),
        ([[2]], ["float32"], 0, "at least 1"),
    ],
)
def test_impossible_plans_are_refused_naming_the_value(shapes, dtypes, bucket_bytes, message):
    with pytest.raises(ValueError, match=message):
        plan_buckets(shapes, dtypes, bucket_bytes)
