"""``pipelinerl bench learning --quick`` for real: runs, checkpoint evaluations, the JSON record, the
MLflow parent with its children and figure (numbers are meaningless at this size; no timing checks)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from pipelinerl.bench.learning import variant_label
from pipelinerl.plan.measured import measured
from pipelinerl.plan.validation import compare, markdown_table
from tests.conftest import worker_port

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
def test_bench_learning_quick(tmp_path: Path, random_model_dir: Path):
    out = tmp_path / "learning.json"
    command = [
        str(Path(sys.executable).parent / "pipelinerl"),
        "bench",
        "learning",
        "--quick",
        "--no-async",
        # Strict rounds (generation, then training) are conventional mode with one setting changed: the
        # mode itself is test_pipeline.py's; leaving the variant out saves a whole run here.
        "--no-strict",
        "--set",
        f"model.path={random_model_dir}",
        "--set",
        f"run.output_dir={tmp_path / 'runs'}",
        "--set",
        f"transport.base_port={worker_port(22600)}",
        "--out",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=480, env=dict(os.environ))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["benchmark"] == "learning"
    for key in (
        "pipeline/times_faster_than_conventional_g2",
        "ess_mean_pipeline",
        "ess_mean_conventional_g2",
        "target_success",
    ):
        assert key in record, key
    assert 0.0 < record["ess_mean_pipeline"] <= 1.0
    # One seed here: its own start plus the gain, measured by its runs.
    (start,) = record["start_success_by_seed"].values()
    assert record["target_success"] == pytest.approx(start + 0.10)
    assert record["target_success_by_seed"] == {"0": pytest.approx(start + 0.10)}
    assert "pipeline/times_faster_than_conventional_g2_strict" not in record, "--no-strict left it out"
    assert len(record["pipeline/times_faster_than_conventional_g2_per_seed"]) == 1
    assert not any(key.startswith("speedup") for key in record), "one name for the ratio"
    rows = {row["variant"]: row for row in record["variants"]}
    assert set(rows) == {"pipeline", "conventional_g2"}
    assert set(rows["pipeline"]["times_faster_than"]) == {"conventional_g2"}
    for row in rows.values():  # the numbers behind the paper's claims
        assert 0.0 <= row["multi_version_fraction"] <= 1.0
        assert row["lag_early"] is not None and row["lag_late"] is not None
    assert rows["conventional_g2"]["multi_version_fraction"] == 0.0, "one version per sequence"
    for run in record["runs"]:
        versions_evaluated = len(run["points"]) - 1
        assert versions_evaluated == 2, "checkpoints at v2 and v4 (final) were evaluated"
        assert all(math.isfinite(success) and 0 <= success <= 1 for _, _, success in run["points"])
        # The final policy's success sits where its last step was trained (comparison.trained_at).
        metrics = (Path(run["run_dir"]) / "metrics.jsonl").read_text()
        steps = [json.loads(line) for line in metrics.splitlines()]
        assert run["points"][-1][:2] == [steps[-1]["wall_s"], steps[-1]["samples/trained"]]
    assert record["settings"]["actor_cpus"] != record["settings"]["trainer_cpus"] or os.cpu_count() == 1
    assert "| pipeline |" in done.stdout
    assert out.with_suffix(".png").stat().st_size > 10_000, "the overlay figure beside the record"
    paper_figure = tmp_path / "learning-paper.png"
    assert record["paper_figure"] == str(paper_figure)
    assert paper_figure.stat().st_size > 20_000, "the paper's four panels beside the record"

    # The record summarised again from its measured curves with another gain, without running.
    again_out = tmp_path / "again.json"
    resummarised = subprocess.run(
        [
            command[0],
            "bench",
            "learning",
            "--from-record",
            str(out),
            "--target-gain",
            "0.0",
            "--out",
            str(again_out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resummarised.returncode == 0, resummarised.stdout[-3000:] + resummarised.stderr[-3000:]
    again_record = json.loads(again_out.read_text())
    assert again_record["target_gain"] == 0.0
    assert [r["points"] for r in again_record["runs"]] == [r["points"] for r in record["runs"]]
    assert all(row["time_to_target_s_per_seed"] == [0.0] for row in again_record["variants"]), (
        "start = target"
    )

    # The same figure drawn again from the runs' directories, without re-running them.
    redrawn = tmp_path / "redrawn.png"
    again = subprocess.run(
        [command[0], "bench", "figures", *(run["run_dir"] for run in record["runs"]), "--out", str(redrawn)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert redrawn.stat().st_size > 20_000
    for name in ("| PipelineRL |", "| conventional G=2 |"):
        assert name in again.stdout, again.stdout

    # Issue 27's check against measured runs, small (plan/validation.py): conventional mode predicted
    # from a profile calibrated on the pipeline run only (a conventional run's actor records are taken
    # between rounds, with nothing in flight: the decode step cannot be fitted from them), beside what
    # its own run measured.
    runs = {
        variant_label(json.loads((Path(run["run_dir"]) / "config.json").read_text())): [Path(run["run_dir"])]
        for run in record["runs"]
    }
    (conventional,) = compare(runs, prompt_tokens=40, predict=["conventional_g2"])
    assert conventional.measured == measured(runs["conventional_g2"][0]), "one run: its own figures"
    assert conventional.predicted["steady_samples_per_s"] > 0
    assert 0.0 <= conventional.predicted["trainer_idle"] <= 1.0
    # Rounds of G=2 steps on one version: lags 0 and 1, however fast either side runs, in both.
    assert conventional.measured["lag_max"] == conventional.predicted["lag_max"] == 1
    assert conventional.within["lag_mean"], conventional
    assert "| conventional_g2 |" in markdown_table([conventional])

    client = mlflow.MlflowClient()
    parent = client.get_run(record["settings"]["mlflow_parent_run_id"])
    assert parent.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "figures")}
    assert {"figures/learning.png", "figures/paper.png"} <= artifacts
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    assert len(children) == 2 and all(child.info.status == "FINISHED" for child in children)
    assert not any(key.startswith("speedup") for key in parent.data.metrics)
