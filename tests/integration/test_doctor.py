"""``pipelinerl doctor`` for real on this machine: torch, DeepSpeed, the vLLM environment, a gloo
all-reduce between two processes, PostgreSQL as the platform database, a real MLflow store, the config
against this machine, and ``--smoke``: a real 3-step run whose record and MLflow run are checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sqlalchemy import create_engine, text

from pipelinerl.doctor import services
from pipelinerl.launch.stages import vllm_python
from pipelinerl.platform.config import PipelineConfig, load_config
from pipelinerl.platform.tracking import db
from tests.conftest import worker_port

ROOT = Path(__file__).resolve().parents[2]


def config(tmp_path: Path, *overrides: str) -> PipelineConfig:
    return load_config(None, [f"run.home={tmp_path / 'home'}", *overrides])


def test_doctor_and_its_smoke_run_pass_on_this_machine(
    tmp_path: Path, postgres_url: str, second_postgres_url: str, random_model_dir: Path
) -> None:
    db.upgrade(postgres_url)  # the platform database migrated; MLflow's store (the second) never was
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PREFECT_API_URL", "CUDA_VISIBLE_DEVICES")
    }
    record = tmp_path / "smoke-record.json"
    argv = [sys.executable, "-m", "pipelinerl.cli", "doctor", "--json", "--smoke", "--record", str(record)]
    for setting in (
        # A model directory (the smoke run trains three steps, it need not learn): not the warm start,
        # which the vLLM learning run builds on a fresh machine and this test would wait for.
        f"model.path={random_model_dir}",
        f"run.home={tmp_path / 'home'}",
        f"run.output_dir={tmp_path / 'runs'}",
        f"tracking.database_url={postgres_url}",
        f"tracking.mlflow_uri={second_postgres_url}",
        f"transport.base_port={worker_port(23430)}",
    ):
        argv += ["--set", setting]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    checks = {check["name"]: check for check in answer["checks"]}
    statuses = {name: check["status"] for name, check in checks.items()}
    assert answer["ok"] and answer["counts"]["FAIL"] == 0, statuses
    for name in ("python", "torch", "memory", "DeepSpeed", "transformers", "transport ports"):
        assert statuses[name] == "PASS", (name, checks[name])
    gloo = checks["gloo, 2 CPU processes"]
    assert (
        gloo["status"] == "PASS"
        and gloo["data"]["all_reduce_mb_s"] > 0
        and gloo["data"]["broadcast_mb_s"] > 0
    )
    assert (
        checks["platform database"]["status"] == "PASS"
        and "at revision" in checks["platform database"]["detail"]
    )
    mlflow = checks["tracking store (MLflow)"]
    assert (
        mlflow["status"] == "WARN"
        and "never migrated" in mlflow["detail"]
        and "mlflow db upgrade" in mlflow["fix"]
    )
    assert statuses["Prefect API"] == "SKIP"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert statuses["NCCL" if gpus == 0 else next(n for n in statuses if n.startswith("NCCL"))] == (
        "SKIP" if gpus == 0 else "PASS"
    )
    # .venv-vllm (make vllm-env) holds a supported vLLM; a release newer than the newest tested warns
    assert statuses["vLLM environment"] in (("PASS", "WARN") if vllm_python().is_file() else ("SKIP",))
    for name in ("model", "GPUs per role", "memory per role", "memory fit"):  # the config on this machine
        assert statuses[name] == "PASS", (name, checks[name])
    assert checks["weight updates"]["data"]["backend"] == "gloo"  # the default: a transformers actor
    assert "embedded" not in checks["model"]["detail"] and "CPU only" in checks["GPUs per role"]["detail"]

    # --smoke: three steps trained, every update loaded in flight with its phases, the record written
    smoke = [check for check in answer["checks"] if check["section"] == "smoke run"]
    assert [check["status"] for check in smoke] == ["PASS"] * len(smoke), smoke
    figures = checks["steps"]["data"]
    assert figures["steps"] == 3 and figures["updates_loaded"] >= 2, figures
    assert figures["buckets_refused"] == 0 and figures["notices_lost"] == 0
    assert {"pause", "load", "label_resume"} <= set(figures["update_phases_ms_median"])
    assert figures["actor_tokens_per_s_median"] > 0 and figures["trainer_step_s_median"] > 0
    assert figures["peak_memory_gib"]["host"] > 0.2 and answer["smoke_s"] > 0
    saved = json.loads(record.read_text())
    assert saved["benchmark"] == "smoke" and saved["device"] == "cpu"
    assert saved["update_pause_ms_median"] == figures["update_pause_ms_median"]
    assert saved["machine"]["logical_cores"] == os.cpu_count() and saved["command"].startswith(
        "pipelinerl doctor --json --smoke"
    )
    run_dir = Path(saved["run_dir"])
    assert json.loads((run_dir / "smoke.json").read_text())["figures"] == saved["figures"]
    for update in [json.loads(line) for line in (run_dir / "actor0.jsonl").read_text().splitlines()]:
        phases = [value for key, value in update.items() if key.startswith("weights/update_phase_ms/")]
        if "weights/update_pause_ms" in update:  # each loaded update's phases add up to its pause
            assert sum(phases) == pytest.approx(update["weights/update_pause_ms"], rel=1e-6), update
    trained = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["policy_version"] for record in trained] == [1, 2, 3]
    # tracked like any run: its MLflow run holds the same steps
    from mlflow.tracking import MlflowClient  # noqa: PLC0415 (heavy: only this test)

    mlflow_run = MlflowClient(tracking_uri=second_postgres_url).get_run(
        (run_dir / "mlflow_run_id").read_text()
    )
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.metrics["summary/steps"] == 3


def test_a_platform_database_behind_head_warns_and_one_ahead_fails(tmp_path: Path, postgres_url: str) -> None:
    db.upgrade(postgres_url, "0001")
    behind = services.check_platform_database(config(tmp_path, f"tracking.database_url={postgres_url}"))
    assert behind.status == "WARN" and "behind" in behind.detail and behind.fix == "pipelinerl db upgrade"
    engine = create_engine(postgres_url)
    with engine.begin() as connection:
        connection.execute(text(f"UPDATE {db.VERSION_TABLE} SET version_num = '9999'"))
    engine.dispose()
    ahead = services.check_platform_database(config(tmp_path, f"tracking.database_url={postgres_url}"))
    assert ahead.status == "FAIL" and "9999" in ahead.detail


def test_a_migrated_mlflow_store_passes(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient  # noqa: PLC0415 (heavy: only this test)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).search_experiments()  # creates and migrates the store
    check = services.check_tracking_store(config(tmp_path, f"tracking.mlflow_uri={uri}"))
    assert check.status == "PASS" and "newest schema" in check.detail
