"""``pipelinerl doctor`` for real on this machine: torch, DeepSpeed, the vLLM environment, a gloo
all-reduce between two processes, PostgreSQL as the platform database, a real MLflow store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

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


def test_doctor_passes_on_this_machine(tmp_path: Path, postgres_url: str, second_postgres_url: str) -> None:
    db.upgrade(postgres_url)  # the platform database migrated; MLflow's store (the second) never was
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PREFECT_API_URL", "CUDA_VISIBLE_DEVICES")
    }
    argv = [sys.executable, "-m", "pipelinerl.cli", "doctor", "--json"]
    for setting in (
        f"run.home={tmp_path / 'home'}",
        f"run.output_dir={tmp_path / 'runs'}",
        f"tracking.database_url={postgres_url}",
        f"tracking.mlflow_uri={second_postgres_url}",
        f"transport.base_port={worker_port(23430)}",
    ):
        argv += ["--set", setting]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)
    elapsed = time.perf_counter() - start
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
    assert elapsed < 60, f"doctor took {elapsed:.1f} s"


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
