"""``run.plan_profile`` is checked before the run starts, and a run too short to compare says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelinerl.launch.run_prediction import check_plan_profile, record_prediction
from pipelinerl.platform.config import ConfigError, load_config


def test_an_unreadable_profile_fails_before_the_run_naming_it() -> None:
    check_plan_profile(load_config(None, []))  # none asked
    check_plan_profile(load_config(None, ["run.plan_profile=cpu-2core"]))
    with pytest.raises(ConfigError, match="run.plan_profile='a100-7b': profile 'a100-7b': no such file"):
        check_plan_profile(load_config(None, ["run.plan_profile=a100-7b"]))


def test_a_run_without_records_to_compare_says_why_in_the_file(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("")
    record_prediction(load_config(None, ["run.plan_profile=cpu-2core"]), tmp_path, None, [])
    assert "error" in json.loads((tmp_path / "plan_prediction.json").read_text())
    record_prediction(load_config(None, []), tmp_path / "none", None, [])  # not planned: nothing written
    assert not (tmp_path / "none").exists()
