"""The learning benchmark's pure logic: success curves, time to target, times faster, the core split."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pipelinerl.bench.learning import (
    VariantResult,
    claim_numbers,
    paper_figure_runs,
    readable_label,
    redraw_paper_figures,
    results_from_record,
    retarget,
    split_cores,
    success_curve,
    summarize_bench,
    time_to_target,
    times_faster_than_baselines,
    variant_label,
    variants,
)
from pipelinerl.bench.learning_tables import table_rows


def record(version: int, wall: float, samples: int) -> dict:
    return {"policy_version": version, "wall_s": wall, "samples/trained": samples}


def test_success_curve_starts_at_version_zero_and_follows_evaluated_versions():
    records = [record(v, 10.0 * v, 32 * v) for v in range(1, 7)]
    points = success_curve(0.30, {6: 0.5, 2: 0.35, 4: 0.42}, records)
    assert points == [(0.0, 0, 0.30), (20.0, 64, 0.35), (40.0, 128, 0.42), (60.0, 192, 0.5)]
    # A checkpoint of version 0 is the start point already; a version without a step record is left out.
    assert success_curve(0.30, {0: 0.31, 9: 0.6}, records) == [(0.0, 0, 0.30)]


def test_time_to_target_is_the_first_checkpoint_at_or_above_it():
    points = [(0.0, 0, 0.30), (20.0, 64, 0.41), (40.0, 128, 0.39), (60.0, 192, 0.5)]
    assert time_to_target(points, 0.40) == 20.0
    assert time_to_target(points, 0.45) == 60.0
    assert time_to_target(points, 0.60) is None


def test_pipeline_is_times_faster_than_each_baseline_by_their_time_over_its():
    assert times_faster_than_baselines({"pipeline": 50.0, "conventional_g8": 120.0, "async": None}) == {
        "conventional_g8": 2.4,
        "async": None,
    }
    assert times_faster_than_baselines({"pipeline": None, "conventional_g1": 10.0}) == {
        "conventional_g1": None
    }


def test_cores_split_in_halves():
    assert split_cores([0, 1]) == ([0], [1])
    assert split_cores([3, 0, 2, 1]) == ([0, 1], [2, 3])
    assert split_cores([0]) == ([], [])


def test_variants_are_named_for_the_json_keys():
    assert [v.label for v in variants()] == [
        "pipeline",
        "conventional_g1",
        "conventional_g4",
        "conventional_g8",
        "conventional_g8_strict",
        "async",
    ]
    chosen = variants([8], with_async=False)
    assert chosen[1].overrides == {"run.mode": "conventional", "run.steps_per_round": 8}
    assert chosen[2].overrides == {
        "run.mode": "conventional",
        "run.steps_per_round": 8,
        "run.train_during_round": False,  # the paper's baseline: generation, then training
    }
    assert [v.label for v in variants([4], with_async=False, strict=False)] == ["pipeline", "conventional_g4"]
    assert [v.label for v in variants([], with_async=False)] == ["pipeline"]


def test_the_paper_figures_compare_pipeline_with_the_largest_g():
    labels = ("pipeline", "conventional_g1", "conventional_g8", "conventional_g8_strict", "async")
    runs = {label: [{"label": label}] for label in labels}
    chosen = paper_figure_runs(runs)
    assert list(chosen) == ["PipelineRL", "conventional G=8", "conventional G=8, strict rounds"]
    assert chosen["conventional G=8"] == runs["conventional_g8"]
    assert list(paper_figure_runs({"pipeline": []})) == ["PipelineRL"]


def test_a_run_config_names_its_variant_as_the_bench_does():
    def config(mode: str, g: int = 8, during: bool = True) -> dict:
        return {"run": {"mode": mode, "steps_per_round": g, "train_during_round": during}}

    assert variant_label(config("pipeline")) == "pipeline"
    assert variant_label(config("async")) == "async"
    assert variant_label(config("conventional", 4)) == "conventional_g4"
    assert variant_label(config("conventional", 8, during=False)) == "conventional_g8_strict"
    assert [readable_label(v.label) for v in variants([8])] == [
        "PipelineRL",
        "conventional G=8",
        "conventional G=8, strict rounds",
        "async",
    ]


def step(version: int, by_position: list[float | None], multi: int, ess: float, lag_max: int) -> dict:
    return {
        "policy_version": version,
        "wall_s": 2.0 * version,
        "rl/reward_mean": 0.5,
        "rl/ess": ess,
        "lag/max": lag_max,
        "lag/histogram": [1, 1, 1],
        "lag/by_position": by_position,
        "lag/position_bucket_size": 8,
        "trainer/samples": 4,
        "trainer/inflight_sequences": multi,
    }


# Late positions younger than early ones; 3 of 8 sequences written by two or more versions.
PIPELINE_STEPS = [step(1, [2.0, 1.0, 1.0, 0.0], 1, 0.99, 2), step(2, [4.0, 3.0, 2.0, 1.0], 2, 0.95, 4)]


def test_claim_numbers_from_step_records():
    numbers = claim_numbers(PIPELINE_STEPS)
    assert numbers == {
        "lag_early": pytest.approx(3.0),  # position bucket 0: mean of 2 and 4
        "lag_late": pytest.approx(0.5),  # the last bucket: mean of 0 and 1
        "multi_version_fraction": pytest.approx(3 / 8),
        "ess_mean": pytest.approx(0.97),
        "ess_min": pytest.approx(0.95),
        "lag_max": 4,
    }
    assert claim_numbers([])["lag_early"] is None


def write_run(run_dir: Path, mode: str, records: list[dict], seed: int = 0) -> Path:
    run_dir.mkdir(parents=True)
    run = {"mode": mode, "steps_per_round": 8, "train_during_round": True, "seed": seed}
    (run_dir / "config.json").write_text(json.dumps({"run": run}))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def test_the_paper_figures_are_drawn_again_from_run_directories(tmp_path: Path):
    flat = [step(1, [1.0, 1.0], 0, 1.0, 1), step(2, [0.0, 0.0], 0, 1.0, 1)]
    pipeline = write_run(tmp_path / "p", "pipeline", PIPELINE_STEPS)
    conventional = write_run(tmp_path / "c", "conventional", flat)
    claims = redraw_paper_figures([pipeline, conventional], tmp_path / "paper.png")
    assert (tmp_path / "paper.png").stat().st_size > 10_000
    assert list(claims) == ["PipelineRL", "conventional G=8"]
    assert claims["conventional G=8"]["multi_version_fraction"] == 0.0
    with pytest.raises(ValueError, match="both pipeline: give one run per variant"):
        redraw_paper_figures([pipeline, pipeline], tmp_path / "twice.png")
    with pytest.raises(ValueError, match="has no config.json"):
        redraw_paper_figures([tmp_path], tmp_path / "none.png")
    empty = write_run(tmp_path / "e", "async", [])
    with pytest.raises(ValueError, match="has no step records"):
        redraw_paper_figures([empty], tmp_path / "empty.png")


def result(label: str, seed: int, ttt: float | None, ess: float) -> VariantResult:
    return VariantResult(
        label=label,
        seed=seed,
        run_dir="runs/x",
        points=[(0.0, 0, 0.3)],
        time_to_target_s=ttt,
        ess_mean=ess,
        ess_min=ess - 0.01,
        lag_mean=1.0,
        lag_p90=2.0,
        lag_max=3,
        actor_idle_fraction=None,
        trainer_idle_fraction=0.2,
        samples_per_s=10.0,
        tokens_per_s=300.0,
        eval_success_end=0.5,
        wall_s=100.0,
    )


def test_summary_takes_medians_of_per_seed_ratios_and_names_the_headline_keys():
    results = [
        result("pipeline", 0, 40.0, 0.99),
        result("pipeline", 1, 60.0, 0.97),
        result("pipeline", 2, 50.0, 0.98),
        result("conventional_g8", 0, 100.0, 1.0),
        result("conventional_g8", 1, 60.0, 1.0),
        result("conventional_g8", 2, 75.0, 1.0),
    ]
    report = summarize_bench(results, 0.1, ["pipeline", "conventional_g8"])
    headline = report["headline"]
    # Per seed: 100/40 = 2.5, 60/60 = 1.0, 75/50 = 1.5; the median of the ratios, with all three.
    assert headline["pipeline/times_faster_than_conventional_g8"] == pytest.approx(1.5)
    assert headline["pipeline/times_faster_than_conventional_g8_per_seed"] == pytest.approx([2.5, 1.0, 1.5])
    assert not any(key.startswith("speedup") for key in headline), "one name for the ratio"
    assert headline["start_success_by_seed"] == {"0": 0.3, "1": 0.3, "2": 0.3}
    assert headline["target_success_by_seed"]["1"] == pytest.approx(0.4)
    assert headline["ess_mean_pipeline"] == pytest.approx(0.98)
    assert headline["ess_mean_conventional_g8"] == 1.0
    rows = {row["variant"]: row for row in report["details"]["variants"]}
    assert rows["conventional_g8"]["time_to_target_s_per_seed"] == [100.0, 60.0, 75.0]
    assert rows["pipeline"]["times_faster_than"] == {"conventional_g8": pytest.approx(1.5)}
    assert rows["pipeline"]["times_faster_than_per_seed"]["conventional_g8"] == pytest.approx([2.5, 1.0, 1.5])
    # The markdown table: PipelineRL's ratio in each baseline's row, 1 in its own.
    assert [row[2] for row in table_rows(report["details"])] == [1.0, pytest.approx(1.5)]
    # A seed that never reached the target leaves the median undefined rather than optimistic.
    partial = summarize_bench(
        [*results[:5], result("conventional_g8", 2, None, 1.0)], 0.1, ["pipeline", "conventional_g8"]
    )
    assert partial["headline"]["pipeline/times_faster_than_conventional_g8"] is None


def test_each_seed_is_timed_to_its_own_start_plus_the_gain():
    low = dataclasses.replace(
        result("pipeline", 1, None, 1.0), points=[(0.0, 0, 0.33), (10.0, 320, 0.36), (20.0, 640, 0.40)]
    )
    high = dataclasses.replace(
        result("pipeline", 0, None, 1.0), points=[(0.0, 0, 0.49), (10.0, 320, 0.52), (30.0, 960, 0.56)]
    )
    timed = retarget(results_from_record({"runs": [dataclasses.asdict(low), dataclasses.asdict(high)]}), 0.06)
    assert [r.time_to_target_s for r in timed] == [20.0, 30.0]  # 0.39 for seed 1, 0.55 for seed 0
