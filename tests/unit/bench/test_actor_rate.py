"""The actor's rate as ``bench transport`` reads it from a run directory (pure: files in, figures out)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelinerl.bench.actor_rate import actor_rate_from_run_dir


def test_actor_rate_from_a_run_directory(tmp_path: Path) -> None:
    actor_records = [
        {"time": 100.0, "actor/tokens_generated": 1_000},
        {"time": 110.0, "actor/tokens_generated": 6_000},
    ]
    (tmp_path / "actor0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in actor_records))
    steps = [
        {"trainer/tokens": 1_600, "trainer/samples": 32, "time": 100.0},
        {"tokens": 1_600, "samples": 32, "time": 101.0},  # written before the metric renames
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    rate = actor_rate_from_run_dir(tmp_path)
    assert rate.source == "run_dir"
    assert rate.tokens_per_s == pytest.approx(500.0)
    assert rate.rollouts_per_s == pytest.approx(10.0)  # 500 tokens/s at 50 tokens per rollout
