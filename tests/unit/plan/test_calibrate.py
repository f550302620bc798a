"""The fit behind ``pipelinerl plan calibrate`` on records whose costs are known (``plan/calibrate.py``);
``test_tracking.py`` calibrates on a real run's records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipelinerl.plan.calibrate import (
    CalibrationError,
    calibrate,
    completion_lengths,
    decode_table_from,
    lengths_of_runs,
)
from pipelinerl.plan.fitting import nonnegative_fit
from pipelinerl.platform.tracking import metric_registry as registry


def write_run(directory: Path, steps: list[dict], actor: list[dict]) -> Path:
    directory.mkdir(parents=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    (directory / "actor0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in actor))
    return directory


def step(tokens: int, samples: int = 32, broadcast_ms: float = 40.0) -> dict:
    return {
        registry.TRAINER_TOKENS: tokens,
        registry.TRAINER_SAMPLES: samples,
        registry.TRAINER_STEP_S: 0.5 + 1e-4 * tokens + 0.01 * samples,
        registry.WEIGHTS_BROADCAST_MS: broadcast_ms,
    }


def actor(in_flight: int, pause_ms: float = 3.0) -> dict:
    step_s = 0.02 + 0.001 * in_flight  # one decode step of in_flight sequences
    return {
        registry.ACTOR_IN_FLIGHT: in_flight,
        registry.ACTOR_TOKENS_PER_S: in_flight / step_s,
        registry.UPDATE_PAUSE_MS: pause_ms,
    }


def test_the_fit_recovers_known_costs_from_two_runs(tmp_path) -> None:
    first = write_run(tmp_path / "a", [step(t) for t in (1000, 1500, 2200)], [actor(n) for n in (8, 16, 32)])
    second = write_run(
        tmp_path / "b", [step(t, samples=64, broadcast_ms=60) for t in (3000, 4100)], [actor(64, pause_ms=5)]
    )
    profile = calibrate([first, second], "known")
    costs = profile.cost_model()
    assert costs.train_base_s == pytest.approx(0.5)
    assert costs.train_per_token_s == pytest.approx(1e-4)
    assert costs.train_per_sequence_s == pytest.approx(0.01)  # the runs differ in B: it can be told apart
    assert costs.decode_base_s == pytest.approx(0.02)
    assert costs.decode_per_sequence_s == pytest.approx(0.001)
    assert costs.transfer_s == pytest.approx(0.040)  # the median of 40, 40, 40, 60, 60 ms
    assert costs.update_pause_s == pytest.approx(0.003)
    assert "a, b" in profile.figures["train_base_s"].source


def test_one_run_cannot_tell_a_per_sequence_cost_and_says_so(tmp_path) -> None:
    run = write_run(tmp_path / "a", [step(t) for t in (1000, 1500, 2200)], [actor(n) for n in (8, 16)])
    profile = calibrate([run], "one")
    assert profile.figures["train_per_sequence_s"].value == 0.0
    assert "trained B sequences" in profile.figures["train_per_sequence_s"].source
    assert profile.figures["train_base_s"].value == pytest.approx(0.5 + 0.01 * 32)


def test_a_negative_coefficient_is_dropped_and_the_rest_refitted() -> None:
    # y = 2x exactly, plus a column that would take a negative coefficient
    x, other = [1.0, 2.0, 3.0, 4.0], [1.0, 0.0, 1.0, 0.0]
    y = [2 * a - 0.5 * b for a, b in zip(x, other, strict=True)]
    coefficients = nonnegative_fit([x, other], y)
    assert coefficients[1] == 0.0 and coefficients[0] > 0


def test_runs_without_the_records_are_named(tmp_path) -> None:
    with pytest.raises(CalibrationError, match="no metrics.jsonl"):
        calibrate([tmp_path], "x")
    short = write_run(tmp_path / "short", [step(1000)], [actor(8)])
    with pytest.raises(CalibrationError, match="1 trainer steps recorded"):
        calibrate([short], "x")
    idle = write_run(tmp_path / "idle", [step(1000), step(2000)], [actor(0)])
    with pytest.raises(CalibrationError, match="no actor record with sequences in flight"):
        calibrate([idle], "x")


def test_completion_lengths_are_read_from_the_per_token_files(tmp_path) -> None:
    (tmp_path / "tokens").mkdir()
    for step, lengths in ((1, [3, 1, 4]), (2, [2])):
        positions = np.concatenate([np.arange(n) for n in lengths]).astype(np.int32)
        np.savez(tmp_path / "tokens" / f"step_{step:06d}_rank0.npz", token_positions=positions)
    assert sorted(completion_lengths([tmp_path]).observed) == [1, 2, 3, 4]
    with pytest.raises(CalibrationError, match="no per-token files"):
        completion_lengths([tmp_path / "tokens"])


def _token_files(run: Path, lengths: list[int]) -> Path:
    (run / "tokens").mkdir(parents=True)
    positions = np.concatenate([np.arange(n) for n in lengths]).astype(np.int32)
    np.savez(run / "tokens" / "step_000001_rank0.npz", token_positions=positions)
    return run


def test_a_profile_carries_the_lengths_of_the_runs_it_was_calibrated_on(tmp_path) -> None:
    spread = _token_files(tmp_path / "spread", list(range(10, 60)))  # mean 34.5, p90 54.1
    assert lengths_of_runs([spread]) == "lognormal:34.5,54.1"
    one = _token_files(tmp_path / "one", [20] * 8)
    assert lengths_of_runs([one]) == "fixed:20"
    heavy = _token_files(tmp_path / "heavy", [1] * 80 + [2] * 9 + [5000] * 11)  # too heavy for a lognormal
    assert lengths_of_runs([heavy]).startswith("loglogistic:")
    assert lengths_of_runs([tmp_path / "none"]) is None


def test_the_trainer_steps_spread_around_the_fit_is_measured(tmp_path) -> None:
    exact = write_run(tmp_path / "exact", [step(t) for t in (1000, 1500, 2200)], [actor(8), actor(16)])
    assert calibrate([exact], "x").figures["train_step_log_sd"].value == pytest.approx(0.0, abs=1e-9)
    noisy_steps = [step(t) for t in (1000, 1000, 1500, 1500)]
    for record, factor in zip(noisy_steps, (1.2, 1 / 1.2, 1.2, 1 / 1.2), strict=True):
        record[registry.TRAINER_STEP_S] *= factor
    noisy = write_run(tmp_path / "noisy", noisy_steps, [actor(8), actor(16)])
    spread = calibrate([noisy], "x").figures["train_step_log_sd"]
    assert spread.value == pytest.approx(np.log(1.2), rel=0.05) and "4 steps" in spread.source


def weights_record(path: Path, model_mib: float, rows: list[tuple[int, float]]) -> Path:
    """A ``bench weights`` record: (buckets of an update, median ms) at each bucket size."""
    path.write_text(
        json.dumps(
            {
                "benchmark": "weights",
                "model_mib": model_mib,
                "bucket_sizes": [{"buckets_per_update": b, "update_ms_median": ms} for b, ms in rows],
            }
        )
    )
    return path


def test_a_weights_record_gives_the_link_and_the_runs_the_fixed_cost(tmp_path) -> None:
    """Updates of 100 MiB at 1 GB/s and 2 ms a bucket; the runs' 200 MiB model in 32 MiB buckets (7 of
    them) took 40 ms more than the link explains: that is the fixed cost."""
    mib = 2**20
    rows = [(b, 1000 * (100 * mib / 1e9 + 0.002 * b)) for b in (100, 25, 4)]
    record = weights_record(tmp_path / "weights.json", 100, rows)
    link_s = 200 * mib / 1e9 + 7 * 0.002
    run = write_run(tmp_path / "a", [step(t, broadcast_ms=1000 * (link_s + 0.04)) for t in (1000, 2000)],
                    [actor(8), actor(16)])  # fmt: skip
    (run / "config.json").write_text(json.dumps({"transport": {"weight_bucket_mib": 32}}))
    with pytest.raises(CalibrationError, match="no final/\\*.safetensors"):
        calibrate([run], "linked", weights_records=[record])
    (run / "final").mkdir()
    (run / "final" / "model.safetensors").write_bytes(b"\0" * (200 * mib))
    profile = calibrate([run], "linked", weights_records=[record])
    assert profile.transfer is not None
    assert profile.transfer.bytes_per_s == pytest.approx(1e9, rel=1e-6)
    assert profile.transfer.per_bucket_s == pytest.approx(0.002, rel=1e-6)
    assert profile.transfer.fixed_s == pytest.approx(0.04, rel=1e-6)
    assert profile.cost_model(32 * mib).transfer_s == pytest.approx(link_s + 0.04)  # the runs' own
    assert profile.cost_model(mib).transfer_s == pytest.approx(200 * mib / 1e9 + 200 * 0.002 + 0.04)
    decode = tmp_path / "decode.json"
    decode.write_text(json.dumps({"benchmark": "decode", "points": []}))
    with pytest.raises(CalibrationError, match="a `pipelinerl bench weights` record is needed .*'decode'"):
        calibrate([run], "linked", weights_records=[decode])


def test_the_engine_alone_is_scaled_to_what_the_runs_actors_wrote(tmp_path) -> None:
    """The sweep's engine alone takes 10 ms at 8 in flight and 20 ms at 32; the run's actor wrote 20 %
    slower at both (its records' busy rates): the profile's table is the sweep's times 1.2, unless
    asked to keep the engine alone. A sweep's point that says how many it held on average is read
    there, at the step of that many."""
    record = tmp_path / "decode.json"
    record.write_text(
        json.dumps(
            {
                "benchmark": "decode",
                "points": [
                    {"in_flight": 8, "step_s": 0.01},  # an older record: H and H / tokens/s
                    {"in_flight": 40, "step_s": 0.025, "mean_in_flight": 32},  # 32 held: 0.02 s a step
                ],
            }
        )
    )
    records = [
        {registry.ACTOR_IN_FLIGHT: n, registry.ACTOR_BUSY_TOKENS_PER_S: n / (1.2 * step)}
        for n, step in ((8, 0.01), (32, 0.02), (20, 0.015))
    ]
    run = write_run(tmp_path / "a", [step(t) for t in (1000, 2000)], records)
    scaled = calibrate([run], "scaled", engine_records=[record], scale_table_to_runs=True).cost_model()
    assert [h for h, _ in scaled.decode_table] == [8, 32]
    assert [step for _, step in scaled.decode_table] == pytest.approx([0.012, 0.024])
    alone = calibrate([run], "alone", engine_records=[record]).cost_model()  # the default
    assert [step for _, step in alone.decode_table] == pytest.approx([0.01, 0.02])


def test_records_of_one_h_make_one_point_of_their_medians(tmp_path) -> None:
    """Two sweeps held 59.2 and 59.6 sequences on average at H=64: one point at their medians, not two
    neighbours 0.4 apart whose 2 ms of noise would read as a slope of 5 ms a sequence."""
    paths = []
    for index, (held, tokens_per_s) in enumerate(((59.2, 1900.0), (59.6, 1800.0))):
        path = tmp_path / f"decode{index}.json"
        points = [
            {"in_flight": 32, "tokens_per_s": 2000.0, "step_s": 32 / 2000.0, "mean_in_flight": 30.0},
            {
                "in_flight": 64,
                "tokens_per_s": tokens_per_s,
                "step_s": 64 / tokens_per_s,
                "mean_in_flight": held,
            },
        ]
        path.write_text(json.dumps({"benchmark": "decode", "points": points}))
        paths.append(path)
    table = decode_table_from(paths)
    assert [h for h, _ in table.points] == [30.0, 59.4]
    assert table.points[1][1] == pytest.approx((59.2 / 1900 + 59.6 / 1800) / 2)
