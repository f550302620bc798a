"""The dashboard's queries on PostgreSQL (the platform database at scale), through the same API."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from fastapi.testclient import TestClient

from pipelinerl.platform.tracking.store import PlatformStore
from pipelinerl.ui.app import UiSettings, create_app
from pipelinerl.ui.load_benchmark import fill_synthetic_run

STEPS = 60


def test_the_api_reads_a_postgresql_platform_database(tmp_path: Path, postgres_url: str) -> None:
    parent = "20261122-100000-compare-pg0001"
    with PlatformStore(postgres_url) as store:
        store.create_run(parent, "pg", "compare", {}, datetime.now(UTC))
    for launched, mode in enumerate(("pipeline", "conventional")):
        fill_synthetic_run(
            tmp_path,
            STEPS,
            f"{parent}-{mode}",
            mode=mode,
            experiment="pg",
            parent_run_id=parent,
            started=datetime(2026, 11, 22, 10, launched, tzinfo=UTC),
            with_mlflow=False,
            database_url=postgres_url,
        )
    with TestClient(create_app(UiSettings(database_url=postgres_url))) as client:
        runs = client.get(f"/api/runs?parent={parent}").json()["runs"]
        assert {run["mode"] for run in runs} == {"pipeline", "conventional"}
        assert all(run["policy_version"] == STEPS and run["lag_max"] == 3 for run in runs)
        steps = client.get(f"/api/runs/{parent}-pipeline/steps?max_points=20").json()
        assert steps["total_steps"] == STEPS and len(steps["version"]) <= 20
        assert client.get(f"/api/runs/{parent}-pipeline/lag-histogram?version=3").json()["version"] == 3
        table = client.get(f"/api/compare?run={parent}").json()["table"]
        assert [row["mode"] for row in table["rows"]] == ["pipeline", "conventional"]
        assert client.get("/api/runs/nope-1").status_code == 404
