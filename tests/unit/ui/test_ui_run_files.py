"""Run directories are read incrementally: only appended bytes, never a line still being written."""

from __future__ import annotations

import json
from pathlib import Path

from pipelinerl.ui.run_files import RunFiles, run_directory


def append(path: Path, text: str) -> None:
    with path.open("a") as file:
        file.write(text)


def test_appended_records_are_read_and_a_partial_line_waits(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    record = {"policy_version": 1, "lag/by_position": [0.0, 1.0], "rollouts": [["a", 0]], "time": 1.0}
    append(metrics, json.dumps(record) + "\n")
    files = RunFiles()
    assert files.trainer_records(tmp_path) == [
        {"policy_version": 1, "lag/by_position": [0.0, 1.0], "time": 1.0}
    ]
    append(metrics, json.dumps({"policy_version": 2, "time": 2.0}) + "\n" + '{"policy_version": 3, "ti')
    assert [r["policy_version"] for r in files.trainer_records(tmp_path)] == [1, 2]
    append(metrics, 'me": 3.0}\n')
    assert [r["policy_version"] for r in files.trainer_records(tmp_path)] == [1, 2, 3]


def test_a_version_written_again_after_a_restart_keeps_its_first_record(tmp_path: Path) -> None:
    lines = [
        {"policy_version": 1, "trainer/inflight_sequences": 4},
        {"policy_version": 1, "trainer/inflight_sequences": 9},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert RunFiles().trainer_records(tmp_path) == [{"policy_version": 1, "trainer/inflight_sequences": 4}]


def test_a_record_written_before_the_metric_renames_is_read_under_the_new_names(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"policy_version": 1, "inflight_sequences": 4}) + "\n")
    assert RunFiles().trainer_records(tmp_path) == [{"policy_version": 1, "trainer/inflight_sequences": 4}]


def test_a_replaced_file_is_read_again_and_a_missing_one_is_empty(tmp_path: Path) -> None:
    files = RunFiles()
    assert files.preprocessor_records(tmp_path) == []
    path = tmp_path / "preprocessor.jsonl"
    path.write_text(json.dumps({"step": 0, "trainer_version": 0, "queue/rollouts": 5}) + "\n" * 3)
    assert files.preprocessor_records(tmp_path)[0]["queue/rollouts"] == 5
    path.write_text(json.dumps({"step": 0}) + "\n")
    assert files.preprocessor_records(tmp_path) == [{"step": 0}]


def test_the_run_directory_comes_from_the_config_or_a_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("")
    assert run_directory({"run": {"output_dir": str(tmp_path / "runs")}}, "r1", []) == run_dir
    checkpoint = str(run_dir / "checkpoints" / "v000025")
    assert run_directory({"run": {"output_dir": "elsewhere"}}, "r1", [checkpoint]) == run_dir
    assert run_directory({}, "r1", []) is None
