"""``compare``: two real runs as child MLflow runs under one parent, with the overlay and table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipelinerl.launch.compare import run_comparison
from pipelinerl.platform.config import load_config
from pipelinerl.platform.tracking.db import database_url
from pipelinerl.platform.tracking.mlflow_store import mlflow_uri
from pipelinerl.platform.tracking.ratios import times_faster
from pipelinerl.platform.tracking.store import PlatformStore
from tests.conftest import worker_port

pytestmark = pytest.mark.slow


def test_pipeline_against_conventional(tmp_path, random_model_dir):
    config = load_config(
        None,
        [
            f"model.path={random_model_dir}",
            f"run.output_dir={tmp_path / 'runs'}",
            f"run.home={tmp_path / 'home'}",
            "run.max_steps=4",
            "run.steps_per_round=2",
            "rl.group_size=4",
            "rl.batch_size=16",
            "actor.max_in_flight=16",
            "task.eval_problems=16",
            f"transport.base_port={worker_port(22300)}",
        ],
    )
    result = run_comparison(config, ["pipeline", "conventional"], target=0.0)
    assert [row.label for row in result.rows] == ["pipeline", "conventional-G2"]
    assert result.target == 0.0
    pipeline, conventional = result.rows
    # One ratio, one direction: each run against the conventional run, its time ÷ the run's.
    assert conventional.times_faster_than == {"conventional-G2": 1.0}
    expected = times_faster(run_s=pipeline.time_to_target_s, baseline_s=conventional.time_to_target_s)
    assert pipeline.times_faster_than == {"conventional-G2": expected}
    assert pipeline.time_to_target_s == result.results["pipeline"].records[0]["wall_s"]
    assert conventional.time_to_target_s == result.results["conventional-G2"].records[0]["wall_s"]
    assert conventional.ess_mean == result.results["conventional-G2"].summary["ess_mean"]
    assert conventional.lag_max <= 1

    client = MlflowClient(tracking_uri=mlflow_uri(config))
    parent = client.get_run(result.mlflow_run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["kind"] == "compare"
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{result.mlflow_run_id}'"
    )
    assert sorted(child.data.tags["mode"] for child in children) == ["conventional", "pipeline"]
    # Named by what they are, so MLflow's chart view tells them apart.
    assert sorted(child.info.run_name for child in children) == ["conventional-G2", "pipeline"]
    assert all(child.info.status == "FINISHED" for child in children)
    artifacts = {a.path for a in client.list_artifacts(result.mlflow_run_id, "figures")}
    assert "figures/comparison.png" in artifacts
    table = json.loads(Path(client.download_artifacts(result.mlflow_run_id, "comparison.json")).read_text())
    assert [row["label"] for row in table["modes"]] == ["pipeline", "conventional-G2"]
    assert parent.data.metrics["conventional-G2/ess_mean"] == pytest.approx(conventional.ess_mean)
    assert table["modes"][0]["times_faster_than"] == pipeline.times_faster_than
    ratio = pipeline.times_faster_than["conventional-G2"]
    assert ratio is not None
    assert parent.data.metrics["pipeline/times_faster_than_conventional-G2"] == pytest.approx(ratio)
    assert not any("time_vs_reference" in key for key in parent.data.metrics)

    store = PlatformStore(database_url(config))
    assert store.get_run(result.comparison_id).run.mode == "compare"
    child_rows = [store.get_run(r.run_dir.name).run for r in result.results.values()]
    assert all(row.parent_run_id == result.comparison_id for row in child_rows)
