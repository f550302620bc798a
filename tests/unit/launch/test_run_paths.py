"""run.resume_from and run.output_dir are checked before any work, naming the setting and the path."""

from __future__ import annotations

import os

import pytest

from pipelinerl.launch.preflight import preflight
from pipelinerl.launch.run_paths import check_run_paths
from pipelinerl.platform.checkpoint import CheckpointInfo, write_info
from pipelinerl.platform.config import ConfigError, load_config


def _config(tmp_path, *overrides):
    return load_config(None, [f"run.output_dir={tmp_path / 'runs'}", "tracking.enabled=false", *overrides])


def test_a_resume_from_that_does_not_exist_is_named_before_the_model_is_read(tmp_path):
    missing = tmp_path / "runs" / "r1" / "checkpoints" / "v000003"
    config = _config(tmp_path, f"run.resume_from={missing}")
    # preflight itself: before the fix it read the path as a model directory ("no usable tokenizer").
    with pytest.raises(ConfigError, match=r"run\.resume_from=.*v000003.*no such directory"):
        preflight(config)


def test_a_resume_from_that_is_a_file_or_not_a_checkpoint_is_named(tmp_path):
    a_file = tmp_path / "model.safetensors"
    a_file.write_bytes(b"")
    with pytest.raises(ConfigError, match=r"run\.resume_from=.*is a file"):
        check_run_paths(_config(tmp_path, f"run.resume_from={a_file}"))
    not_a_checkpoint = tmp_path / "some_dir"
    not_a_checkpoint.mkdir()
    with pytest.raises(ConfigError, match=r"run\.resume_from=.*no config\.json"):
        check_run_paths(_config(tmp_path, f"run.resume_from={not_a_checkpoint}"))


def test_a_checkpoint_at_or_past_max_steps_is_refused(tmp_path):
    checkpoint = tmp_path / "v000010"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    info = CheckpointInfo(run_id="r", policy_version=10, samples_trained=1, tokens_trained=1, created_at=0.0)
    write_info(checkpoint, info)
    with pytest.raises(ConfigError, match=r"run\.resume_from=.*policy version 10; run\.max_steps=10"):
        check_run_paths(_config(tmp_path, f"run.resume_from={checkpoint}", "run.max_steps=10"))
    check_run_paths(_config(tmp_path, f"run.resume_from={checkpoint}", "run.max_steps=11"))


def test_an_output_dir_under_a_file_is_named(tmp_path):
    a_file = tmp_path / "not_a_dir"
    a_file.write_text("x")
    config = load_config(None, [f"run.output_dir={a_file / 'runs'}", "tracking.enabled=false"])
    with pytest.raises(ConfigError, match=r"run\.output_dir=.*not_a_dir.*is a file"):
        preflight(config)


def test_an_output_dir_that_cannot_be_written_is_named(tmp_path):
    # /proc refuses new directories to everyone, root included (the bare "Errno 2" of the report).
    config = load_config(None, ["run.output_dir=/proc/pipelinerl-runs", "tracking.enabled=false"])
    with pytest.raises(ConfigError, match=r"run\.output_dir='/proc/pipelinerl-runs': cannot write there"):
        preflight(config)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_an_output_dir_without_write_permission_is_named(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ConfigError, match=r"run\.output_dir=.*cannot write there"):
        check_run_paths(_config(tmp_path, f"run.output_dir={locked}"))


def test_a_writable_output_dir_is_created_and_left_clean(tmp_path):
    target = tmp_path / "new" / "runs"
    check_run_paths(load_config(None, [f"run.output_dir={target}"]))
    assert target.is_dir() and list(target.iterdir()) == []
