"""A real run whose model and math dataset are named by Hugging Face Hub id, offline.

A tiny random model and a small gsm8k-shaped dataset are put into a temporary Hub cache (the layout
huggingface_hub reads, tests/hub_cache.py); ``pipelinerl run`` (a subprocess, as a user runs it) with
``HF_HUB_OFFLINE=1`` resolves both once, trains 2 steps, and records the ids, the revisions asked and
the commits in the run's config.json, the MLflow run's tags and the platform database's run config.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipelinerl.platform.tracking.store import PlatformStore
from tests.conftest import worker_port
from tests.hub_cache import add_to_cache, gsm8k_settings, write_math_repo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MODEL_ID = "tiny-org/tiny-qwen"
DATASET_ID = "tiny-org/tiny-gsm8k"


def test_a_run_named_by_hub_ids_resolves_them_once_and_records_them(
    tmp_path: Path, random_model_dir: Path
) -> None:
    cache = tmp_path / "hf-cache"
    model_snapshot = add_to_cache(cache, MODEL_ID, random_model_dir, refs=("main", "v1"), commit="c" * 40)
    data_snapshot = add_to_cache(cache, DATASET_ID, write_math_repo(tmp_path / "data"), repo_type="dataset")
    mlflow_db, platform_db = tmp_path / "mlflow.db", tmp_path / "platform.db"
    settings = [
        f"model.path={MODEL_ID}",
        "model.revision=v1",
        *gsm8k_settings(DATASET_ID),
        "task.eval_problems=4",
        f"run.output_dir={tmp_path / 'runs'}",
        f"run.home={tmp_path / 'home'}",
        "run.max_steps=2",
        "run.name=hub-ids",
        "rl.group_size=4",
        "rl.batch_size=8",
        "actor.max_in_flight=8",
        "actor.max_new_tokens=16",
        f"tracking.mlflow_uri=sqlite:///{mlflow_db}",
        f"tracking.database_url=sqlite:///{platform_db}",
        "tracking.flush_interval_s=0.5",
        f"transport.base_port={worker_port(23300)}",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    command = subprocess.run(
        [sys.executable, "-m", "pipelinerl.cli", "run", *[f"--set={setting}" for setting in settings]],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
    )
    assert command.returncode == 0, command.stdout[-3000:] + command.stderr[-3000:]
    (run_dir,) = list((tmp_path / "runs").iterdir())

    # config.json: the snapshots for loading, the ids beside them
    written = json.loads((run_dir / "config.json").read_text())
    assert written["model"]["path"] == str(model_snapshot) and written["model"]["revision"] is None
    assert written["model"]["hub_snapshot"] == {"id": MODEL_ID, "revision": "v1", "commit": "c" * 40}
    assert written["task"]["options"]["dataset"] == str(data_snapshot)
    assert "dataset_revision" not in written["task"]["options"]
    assert written["task"]["hub_snapshot"] == {
        "id": DATASET_ID,
        "revision": None,
        "commit": data_snapshot.name,
    }
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["model_path"] == str(model_snapshot)

    # MLflow tags
    mlflow_run = MlflowClient(tracking_uri=f"sqlite:///{mlflow_db}").get_run(
        (run_dir / "mlflow_run_id").read_text().strip()
    )
    tags = mlflow_run.data.tags
    assert (tags["model.hub_id"], tags["model.revision"], tags["model.commit"]) == (MODEL_ID, "v1", "c" * 40)
    assert (tags["dataset.hub_id"], tags["dataset.revision"], tags["dataset.commit"]) == (
        DATASET_ID,
        "main",
        data_snapshot.name,
    )
    assert tags["model"] == str(model_snapshot)

    # the platform database: the run's config JSON
    store = PlatformStore(f"sqlite:///{platform_db}")
    try:
        detail = store.get_run(run_dir.name)
    finally:
        store.close()
    assert detail.config["model"]["hub_snapshot"] == written["model"]["hub_snapshot"]
    assert detail.config["task"]["hub_snapshot"] == written["task"]["hub_snapshot"]
    assert detail.config["model"]["path"] == str(model_snapshot)


def test_a_run_named_by_a_missing_id_fails_in_preflight(tmp_path: Path) -> None:
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    command = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelinerl.cli",
            "run",
            "--set=model.path=nobody/absent",
            "--set=model.revision=v3",
            f"--set=run.output_dir={tmp_path / 'runs'}",
            f"--set=run.home={tmp_path / 'home'}",
            "--set=tracking.enabled=false",
            f"--set=transport.base_port={worker_port(23310)}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)},
    )
    output = command.stdout + command.stderr
    assert command.returncode != 0
    assert "hf download nobody/absent --revision v3" in output, output[-3000:]
    assert "Traceback" not in output
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir())  # no run directory: nothing started
