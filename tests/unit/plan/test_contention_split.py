"""The stages' sharing of a machine read off the runs' modes (``plan/contention_split.py``), on records
whose costs are known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelinerl.plan.calibrate import calibrate
from pipelinerl.plan.contention_split import company, split_contention
from pipelinerl.platform.config import load_config
from pipelinerl.platform.tracking import metric_registry as registry


def write_run(directory: Path, settings: list[str], step_s: float, actor: list[dict]) -> Path:
    directory.mkdir(parents=True)
    config = load_config(None, settings)
    (directory / "config.json").write_text(config.model_dump_json())
    steps = [
        {registry.TRAINER_TOKENS: tokens, registry.TRAINER_SAMPLES: 32, registry.TRAINER_STEP_S: step_s}
        for tokens in (1000, 1200, 1400)
    ]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    (directory / "actor0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in actor))
    return directory


def test_each_stage_alone_is_measured_where_the_other_waited(tmp_path) -> None:
    """Beside the actor (pipeline) a step takes 0.6 s and the actor writes a 32-sequence step in 20 ms,
    as the engine table says; in strict rounds a step takes 0.45 s and the actor's step 15 ms: each
    goes 25 % faster alone. A conventional run training during its rounds is neither, and left out."""
    table = tmp_path / "decode.json"
    points = [{"in_flight": 8, "step_s": 0.01}, {"in_flight": 32, "step_s": 0.02}]
    table.write_text(json.dumps({"benchmark": "decode", "points": points}))
    beside = write_run(
        tmp_path / "pipeline",
        ["run.mode=pipeline", "actor.max_in_flight=32"],
        0.6,
        [{registry.ACTOR_IN_FLIGHT: 32, registry.ACTOR_BUSY_TOKENS_PER_S: 32 / 0.02}],
    )
    alone = write_run(
        tmp_path / "strict",
        ["run.mode=conventional", "run.train_during_round=false", "actor.max_in_flight=32"],
        0.45,
        [{registry.ACTOR_IN_FLIGHT: 0, registry.ACTOR_BUSY_TOKENS_PER_S: 32 / 0.015}],
    )
    mixed = write_run(tmp_path / "conventional", ["run.mode=conventional"], 5.0, [])
    runs = [beside, alone, mixed]
    profile = split_contention(
        calibrate(runs, "split", engine_records=[table], scale_table_to_runs=True), runs
    )
    costs = profile.cost_model()
    assert costs.train_step_s(1200, 32) == pytest.approx(0.6)  # the pipeline run's steps only
    assert costs.trainer_alone_speedup == pytest.approx(0.25)
    assert costs.actor_alone_speedup == pytest.approx(0.25)
    assert [company(load_config(None, s)) for s in (["run.mode=async"], ["run.mode=conventional"])] == [
        "beside",
        "mixed",
    ]
    # Without runs of both kinds nothing can be told apart: the profile is left as it is.
    only = calibrate([beside], "beside", engine_records=[table])
    assert split_contention(only, [beside]) == only
