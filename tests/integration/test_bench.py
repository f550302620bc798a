"""``pipelinerl bench engine`` and ``bench transport`` run for real at their ``--quick`` sizes.

They prove the benchmarks work end to end (real engine, real ``generate``, real ZeroMQ between
processes, the JSON record and the table); the numbers at these sizes mean nothing, so nothing
here asserts on speed. The engine runs on the small random test model to stay fast.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipelinerl.bench.actor_rate import measure_actor_rate
from pipelinerl.plan.calibrate import CalibrationError, decode_table_from
from tests.conftest import worker_port

PIPELINERL = [sys.executable, "-m", "pipelinerl.cli"]
RECORD_KEYS = (
    "benchmark",
    "command",
    "timestamp",
    "git_commit",
    "machine",
    "load_average",
    "settings",
    "notes",
)


def run_bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PIPELINERL, "bench", *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def assert_positive_finite(record: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        value = record[key]
        assert isinstance(value, int | float) and math.isfinite(value) and value > 0, f"{key} = {value!r}"


@pytest.fixture(scope="module")
def engine_record(random_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("bench") / "engine.json"
    result = run_bench(
        "engine", "--quick", "--model-path", str(random_model_dir), "--out", str(out), cwd=out.parent
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out, result.stdout


def test_bench_engine_quick_writes_its_record_and_table(engine_record: tuple[Path, str]) -> None:
    path, stdout = engine_record
    record = json.loads(path.read_text())
    assert record["benchmark"] == "engine"
    for key in RECORD_KEYS:
        assert record[key], key
    assert_positive_finite(
        record,
        (
            "continuous_over_static_ratio",
            "update_pause_fraction",
            "update_pause_ms_median",
            "update_pause_ms_p99",
            "update_stall_ms_median",
            "continuous_tokens_per_s",
            "continuous_sequences_per_s",
            "static_useful_tokens_per_s",
            "static_raw_tokens_per_s",
        ),
    )
    assert record["updates"]["count"] >= 1
    assert record["settings"]["quick"] is True
    assert set(record["targets"]) == {"continuous_over_static_ratio", "update_pause_fraction"}
    assert "| continuous / static (useful tokens/s) |" in stdout


def test_bench_transport_quick_against_the_engine_record(
    engine_record: tuple[Path, str], tmp_path: Path
) -> None:
    engine_json, _ = engine_record
    out = tmp_path / "transport.json"
    result = run_bench(
        "transport", "--quick", "--engine-json", str(engine_json), "--out", str(out), cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    record = json.loads(out.read_text())
    assert record["benchmark"] == "transport"
    for key in RECORD_KEYS:
        assert record[key], key
    assert record["actor_rate_source"] == "engine_json"
    assert_positive_finite(
        record,
        ("headroom_over_actor", "actor_rollouts_per_s", "transport_rollouts_per_s", "transport_mb_per_s"),
    )
    assert set(record["shapes"]) == {"embedded", "1k", "8k"}
    for shape in record["shapes"].values():
        for path in ("platform", "raw"):
            assert_positive_finite(
                shape[path], ("rollouts_per_s", "mb_per_s", "one_way_us_p50", "one_way_us_p99")
            )
    assert "headroom_over_actor =" in result.stdout
    assert record["curve"] is True, "by default both paths use CurveZMQ, as every run does"


def test_bench_transport_plain_measures_without_curvezmq(
    engine_record: tuple[Path, str], tmp_path: Path
) -> None:
    engine_json, _ = engine_record
    out = tmp_path / "transport-plain.json"
    result = run_bench(
        "transport", "--quick", "--plain", "--engine-json", str(engine_json), "--out", str(out), cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    record = json.loads(out.read_text())
    assert record["curve"] is False and record["settings"]["curve"] is False
    assert any("plain TCP" in note for note in record["notes"])
    assert_positive_finite(record, ("headroom_over_actor", "transport_rollouts_per_s"))


def test_actor_rate_measured_by_a_short_engine_run(random_model_dir: Path) -> None:
    """Without an engine record or a run directory, bench transport measures the actor's rate."""
    rate = measure_actor_rate(random_model_dir, threads=1, quick=True, progress=None)
    assert rate.tokens_per_s > 0 and rate.rollouts_per_s > 0


def test_unknown_engine_is_refused_with_the_valid_ones(tmp_path: Path) -> None:
    result = run_bench("engine", "--engine", "nope", "--quick", cwd=tmp_path)
    assert result.returncode == 2
    assert "nope" in result.stdout and "transformers" in result.stdout


def test_bench_weights_quick_moves_every_update_through_real_weight_groups(tmp_path: Path) -> None:
    """Real member processes receive each update (the run would hang or fail otherwise); the record has
    a row per bucket size with its broadcast count from the bucket plan."""
    out = tmp_path / "weights.json"
    result = run_bench(
        "weights", "--quick", "--port", str(worker_port(28340)), "--out", str(out), cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    record = json.loads(out.read_text())
    for key in RECORD_KEYS:
        assert key in record, key
    rows = {row["bucket_bytes"]: row for row in record["bucket_sizes"]}
    assert sorted(rows) == [1, 1 << 20]
    assert rows[1]["buckets_per_update"] == record["tensors"]  # one broadcast per tensor
    assert rows[1 << 20]["buckets_per_update"] < record["tensors"]
    for row in rows.values():
        assert len(row["update_ms"]) == record["settings"]["repeats"]
        assert_positive_finite(row, ("update_ms_median", "mb_per_s"))
    assert "per tensor" in result.stdout


def test_bench_weights_refuses_a_bucket_size_that_is_not_a_number(tmp_path: Path) -> None:
    result = run_bench("weights", "--bucket-mib", "4,big", cwd=tmp_path)
    assert result.returncode == 2
    assert "'4,big'" in result.stdout


def test_bench_decode_quick_feeds_plan_calibrate(
    random_model_dir: Path, tmp_path: Path, engine_record: tuple[Path, str]
) -> None:
    """The decode sweep's record, pinned to a core, becomes a profile's decode table; another bench's
    record is refused, naming what it is."""
    out = tmp_path / "decode.json"
    result = run_bench(
        "decode",
        "--quick",
        "--cpus",
        "0",
        "--model-path",
        str(random_model_dir),
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    record = json.loads(out.read_text())
    assert record["benchmark"] == "decode" and record["settings"]["cpus"] == [0]
    assert [point["in_flight"] for point in record["points"]] == [4, 8]
    for point in record["points"]:
        assert point["step_s"] == pytest.approx(point["in_flight"] / point["tokens_per_s"])
        # Refilled in whole groups and drained at the end: fewer than H held on average, but some.
        assert 0 < point["mean_in_flight"] <= point["in_flight"]
    assert "| H | held on average | tokens/s | decode step of H (ms) |" in result.stdout

    table = decode_table_from([out])  # the step of the sequences held, not of H
    held = [point["mean_in_flight"] for point in record["points"]]
    assert [h for h, _ in table.points] == pytest.approx(sorted(held), abs=0.01) and "decode" in table.source
    for (_, step), point in zip(table.points, record["points"], strict=True):  # the key is rounded
        assert step == pytest.approx(point["mean_in_flight"] / point["tokens_per_s"], rel=1e-9)
    with pytest.raises(CalibrationError, match="bench decode` record is needed .*'engine'"):
        decode_table_from([engine_record[0]])


def test_bench_decode_refuses_a_core_that_is_not_there(tmp_path: Path) -> None:
    result = run_bench("decode", "--quick", "--cpus", "999", cwd=tmp_path)
    assert result.returncode != 0 and "core(s) [999] are not available here" in result.stdout + result.stderr
