"""The JSON API and the pages' server side on a synthetic database written through the platform's own
store: filters, downsampling, 404s, validation, an unreachable database, and indexed queries."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import and_, create_engine, func, select, tuple_

from pipelinerl.platform.tracking.db import LagHistogram, PolicyVersion, StepStats
from pipelinerl.platform.tracking.store import PlatformStore
from pipelinerl.ui.app import UiSettings, create_app
from pipelinerl.ui.load_benchmark import fast_temporary_root, fill_synthetic_run

PIPELINE = "20261122-100000-compare-ab12cd-pipeline"
CONVENTIONAL = "20261122-100000-compare-ab12cd-conventional-G2"
PARENT = "20261122-100000-compare-ab12cd"
LONG = "20261122-090000-pipeline-long01"
LONG_STEPS = 600


@dataclass(frozen=True)
class Filled:
    database_url: str
    mlflow_uri: str
    root: Path


@pytest.fixture(scope="module")
def filled() -> Iterator[Filled]:
    with tempfile.TemporaryDirectory(prefix="ui-api-", dir=fast_temporary_root()) as directory:
        root = Path(directory)
        long = fill_synthetic_run(root, LONG_STEPS, LONG, experiment="long-runs")
        with PlatformStore(long.database_url) as store:
            store.create_run(
                PARENT,
                "synthetic",
                "compare",
                {"run": {"output_dir": str(root / "runs")}},
                datetime.now(UTC),
                prefect_flow_run_id="5f0c7e0a-flow-run",
            )
        children_start = datetime(2026, 11, 22, 10, tzinfo=UTC)
        fill_synthetic_run(
            root, 40, PIPELINE, parent_run_id=PARENT, seconds_per_step=1.0, started=children_start
        )
        fill_synthetic_run(
            root,
            40,
            CONVENTIONAL,
            mode="conventional",
            parent_run_id=PARENT,
            seconds_per_step=2.0,
            started=children_start + timedelta(minutes=5),
        )
        assert long.mlflow_uri is not None
        yield Filled(long.database_url, long.mlflow_uri, root)


@pytest.fixture(scope="module")
def client(filled: Filled) -> Iterator[TestClient]:
    settings = UiSettings(
        database_url=filled.database_url,
        mlflow_uri=filled.mlflow_uri,
        mlflow_ui_url="http://127.0.0.1:5000",
        prefect_ui_url="http://127.0.0.1:4200",
    )
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_runs_are_listed_newest_first_and_filtered(client: TestClient) -> None:
    body = client.get("/api/runs").json()
    ids = [run["id"] for run in body["runs"]]
    assert set(ids) == {LONG, PARENT, PIPELINE, CONVENTIONAL}
    assert body["experiments"] == ["long-runs", "synthetic"]
    assert body["warnings"] == []
    by_id = {run["id"]: run for run in body["runs"]}
    long = by_id[LONG]
    assert long["policy_version"] == LONG_STEPS and long["steps"] == LONG_STEPS
    assert long["status"] == "finished" and long["lag_max"] == 3
    assert long["tokens_per_s"]["actor"] is not None, "the actor's throughput comes from MLflow"
    assert long["latest_eval"]["name"] == "eval/heldout/pass_at_1", "no end-of-run eval in its summary"
    assert long["links"]["mlflow"].endswith("?workflowType=machine_learning")
    assert long["links"]["mlflow"].startswith("http://127.0.0.1:5000/#/experiments/")

    def ids_for(query: str) -> set[str]:
        return {run["id"] for run in client.get("/api/runs?" + query).json()["runs"]}

    assert by_id[PARENT]["links"]["prefect"] == "http://127.0.0.1:4200/runs/flow-run/5f0c7e0a-flow-run"
    assert by_id[LONG]["links"]["prefect"] is None, "a run not started by a flow has no flow run"
    assert ids_for("mode=conventional") == {CONVENTIONAL}
    assert ids_for("experiment=long-runs") == {LONG}
    assert ids_for("status=running") == {PARENT}
    assert ids_for(f"parent={PARENT}") == {PIPELINE, CONVENTIONAL}
    assert len(ids_for("limit=1")) == 1


@pytest.mark.parametrize(
    "query",
    ["status=paused", "limit=0", "limit=100000", "mode=a%20b", "parent=../etc"],
)
def test_bad_query_parameters_are_a_422_naming_them(client: TestClient, query: str) -> None:
    response = client.get("/api/runs?" + query)
    assert response.status_code == 422
    assert query.split("=")[0] in response.text


def test_steps_are_downsampled_to_max_points(client: TestClient) -> None:
    whole = client.get(f"/api/runs/{LONG}/steps?max_points=1000").json()
    assert whole["returned_steps"] == whole["total_steps"] == LONG_STEPS
    assert whole["version"] == list(range(1, LONG_STEPS + 1))
    assert whole["samples_trained"][:2] == [16, 32]
    assert len(whole["reward_trailing_mean"]) == LONG_STEPS and whole["reward_window"] == 5
    small = client.get(f"/api/runs/{LONG}/steps?max_points=50").json()
    assert len(small["version"]) <= 50 and small["version"][0] == 1 and small["version"][-1] == LONG_STEPS
    assert client.get(f"/api/runs/{LONG}/steps?max_points=1").status_code == 422


def test_lag_histograms_by_version(client: TestClient) -> None:
    newest = client.get(f"/api/runs/{LONG}/lag-histogram").json()
    assert newest["version"] == LONG_STEPS
    assert newest["lag"] == [0, 1, 2, 3][: len(newest["lag"])]
    assert sum(newest["fraction"]) == pytest.approx(1.0)
    assert client.get(f"/api/runs/{LONG}/lag-histogram?version=7").json()["version"] == 7
    missing = client.get(f"/api/runs/{LONG}/lag-histogram?version=99999")
    assert missing.status_code == 404 and "no lag histogram for policy version 99999" in missing.text
    assert client.get(f"/api/runs/{LONG}/lag-histogram?version=-1").status_code == 422


def test_lag_by_position_and_the_live_view(client: TestClient) -> None:
    heat = client.get(f"/api/runs/{LONG}/lag-by-position?max_steps=100").json()
    assert heat["warnings"] == []
    assert len(heat["versions"]) <= 100 and heat["versions"][-1] == LONG_STEPS
    assert heat["bucket_size"] == 8 and len(heat["mean_lag"]) == 16
    live = client.get(f"/api/runs/{LONG}/live").json()
    assert live["policy_version"] == LONG_STEPS and live["warnings"] == []
    assert [c["version"] for c in live["checkpoints"]] == list(range(25, LONG_STEPS + 1, 25))
    assert all(p["broadcast_ms"] > 0 and p["pause_ms"] > 0 for p in live["pauses"])
    assert live["stages"]["actor"]["tokens_per_s"] > 0
    assert live["stages"]["rollout_queue"] is not None
    # Over the newest five steps: 1.5 s training, 0.5 s waiting and the broadcast after each (busy time).
    steps = client.get(f"/api/runs/{LONG}/steps?max_points=1000").json()
    cycle_s = 5 * 2.0 + sum(steps["broadcast_ms"][-5:]) / 1000
    assert live["stages"]["trainer"]["idle_fraction"] == pytest.approx(5 * 0.5 / cycle_s, abs=1e-4)
    assert live["stages"]["trainer"]["idle_fraction"] < 0.25
    newest = 0.5 / (2.0 + steps["broadcast_ms"][-1] / 1000)
    assert steps["trainer_idle_fraction"][-1] == pytest.approx(newest, rel=1e-12), "per step, as MLflow's"
    assert len(live["multi_version_sequences"]) == LONG_STEPS
    assert live["restarts"] == [{"restart": 1, "version": LONG_STEPS // 2, "wall_s": 2.0 * (LONG_STEPS // 2)}]
    [evals] = live["evals"]
    assert evals["name"] == "eval/heldout/pass_at_1"
    assert evals["version"] == list(range(0, LONG_STEPS + 1, LONG_STEPS // 10))
    assert evals["wall_s"][0] == 0.0 and evals["samples_trained"][:2] == [0, 16 * (LONG_STEPS // 10)]
    # Each evaluation sits where the step of its version is on the steps' own time axis.
    steps = client.get(f"/api/runs/{LONG}/steps?max_points=1000").json()
    wall_of = dict(zip(steps["version"], steps["wall_s"], strict=True))
    assert evals["wall_s"][1:] == [wall_of[v] for v in evals["version"][1:]]


def test_a_compare_parent_stands_for_its_children(client: TestClient) -> None:
    body = client.get(f"/api/compare?run={PARENT}&target=0.3").json()
    assert body["parent"] == PARENT
    assert [run["label"] for run in body["runs"]] == ["pipeline", "conventional"]
    table = body["table"]
    assert table["target"] == 0.3 and table["baselines"] == ["conventional"]
    rows = {row["label"]: row for row in table["rows"]}
    # Same rewards step by step, the pipeline run twice as fast per step: about 2 times faster.
    assert rows["pipeline"]["times_faster_than"]["conventional"] == pytest.approx(2.0, rel=0.15)
    assert rows["conventional"]["times_faster_than"]["conventional"] == 1.0
    # The reward chart's trailing mean reaches the target where the table says.
    pipeline = body["runs"][0]["steps"]
    assert pipeline["reward_window"] == table["window"]
    first = next(i for i, value in enumerate(pipeline["reward_trailing_mean"]) if value >= 0.3)
    assert pipeline["wall_s"][first] == pytest.approx(rows["pipeline"]["time_to_target_s"])
    two = client.get(f"/api/compare?run={PIPELINE}&run={CONVENTIONAL}").json()
    assert two["parent"] is None and len(two["runs"]) == 2


def test_unknown_runs_are_404s_in_the_api_and_pages_that_say_so(client: TestClient) -> None:
    for path in ("", "/steps", "/live", "/lag-histogram", "/lag-by-position"):
        response = client.get(f"/api/runs/nope-123{path}")
        assert response.status_code == 404
        assert response.json() == {"detail": "no run 'nope-123' in the platform database"}
    assert client.get("/api/compare?run=nope-123").status_code == 404
    page = client.get("/runs/nope-123")
    assert page.status_code == 404 and "no run &#39;nope-123&#39; in the platform database" in page.text
    assert client.get("/runs/..%2F..%2Fetc").status_code == 404
    experiment = client.get("/?experiment=no-such-experiment")
    assert experiment.status_code == 404 and "no experiment" in experiment.text
    assert client.get("/compare?run=nope-123").status_code == 404
    unknown_experiment = client.get("/api/runs?experiment=no-such-experiment")
    assert unknown_experiment.status_code == 404
    assert unknown_experiment.json() == {
        "detail": "no experiment 'no-such-experiment' in the platform database"
    }
    assert client.get("/api/runs?parent=nope-123").status_code == 404


def test_pages_are_served_with_a_local_plotly(client: TestClient) -> None:
    assert client.get("/").status_code == 200
    assert client.get(f"/runs/{LONG}").status_code == 200
    redirect = client.get(f"/runs/{PARENT}", follow_redirects=False)
    assert redirect.status_code == 303 and redirect.headers["location"] == f"/compare?run={PARENT}"
    assert client.get(f"/compare?run={PIPELINE}&run={CONVENTIONAL}").status_code == 200
    bundle = client.get("/static/plotly.min.js")
    assert bundle.status_code == 200 and len(bundle.content) > 1_000_000
    page = client.get("/").text
    assert "http://" not in page and "https://" not in page, "nothing is loaded from another host"
    assert client.get("/docs").status_code == 404, "Swagger UI would load from a CDN"
    assert "/api/runs/{run_id}/steps" in client.get("/openapi.json").json()["paths"]


def test_an_unreachable_database_is_a_503_naming_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'missing-dir' / 'platform.db'}"
    with TestClient(create_app(UiSettings(database_url=url))) as client:
        response = client.get("/api/runs")
        assert response.status_code == 503
        assert "missing-dir/platform.db" in response.json()["detail"]
        assert client.get("/api/health").json()["database"]["ok"] is False
        page = client.get("/")
        assert page.status_code == 200 and 'id="banner"' in page.text, "the page shows and keeps retrying"
        assert client.get("/runs/some-run").status_code == 200


def test_the_dashboard_never_creates_a_database(tmp_path: Path) -> None:
    absent = tmp_path / "platform.db"
    with TestClient(create_app(UiSettings(database_url=f"sqlite:///{absent}"))) as client:
        assert client.get("/api/runs").status_code == 503
    assert not absent.exists(), "SQLite is opened read-only"


def _plan(url: str, query) -> str:  # type: ignore[no-untyped-def]
    engine = create_engine(url)
    try:
        compiled = query.compile(engine, compile_kwargs={"literal_binds": True})
        with engine.connect() as connection:
            rows = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}").all()
        return " | ".join(str(row[-1]) for row in rows)
    finally:
        engine.dispose()


def test_per_run_queries_search_the_primary_key_indexes(filled: Filled) -> None:
    """What the reader asks per run must not scan whole tables (thousands of steps per run)."""
    steps = (
        select(StepStats, PolicyVersion.samples_trained, PolicyVersion.broadcast_ms)
        .outerjoin(
            PolicyVersion,
            and_(PolicyVersion.run_id == StepStats.run_id, PolicyVersion.version == StepStats.version),
        )
        .where(StepStats.run_id == LONG)
        .order_by(StepStats.version)
    )
    digest = (
        select(StepStats.run_id, func.count(), func.max(StepStats.version))
        .where(StepStats.run_id.in_([LONG, PIPELINE]))
        .group_by(StepStats.run_id)
    )
    newest = (
        select(StepStats, PolicyVersion.broadcast_ms)
        .outerjoin(
            PolicyVersion,
            and_(PolicyVersion.run_id == StepStats.run_id, PolicyVersion.version == StepStats.version),
        )
        .where(tuple_(StepStats.run_id, StepStats.version).in_([(LONG, 5)]))
    )
    histogram = select(LagHistogram.lag, LagHistogram.count).where(
        LagHistogram.run_id == LONG, LagHistogram.version == 5
    )
    for query in (steps, digest, newest, histogram):
        plan = _plan(filled.database_url, query)
        assert "SCAN step_stats" not in plan and "SCAN lag_histograms" not in plan, plan
        assert "SEARCH step_stats" in plan or "SEARCH lag_histograms" in plan, plan


def test_the_metric_registry_is_served_with_the_old_names(client: TestClient) -> None:
    body = client.get("/api/metrics").json()
    by_name = {metric["name"]: metric for metric in body["metrics"]}
    trainer_tokens_per_s = by_name["throughput/trainer_tokens_per_s"]
    assert (
        trainer_tokens_per_s["unit"] == "tokens/s" and trainer_tokens_per_s["api"] == "trainer_tokens_per_s"
    )
    assert "weights/broadcast_ms" in trainer_tokens_per_s["inputs"], "the broadcast is busy time"
    assert by_name["trainer/tokens"]["stored"] == "step_stats.tokens"
    assert by_name["actor/{actor}/idle_fraction"]["pattern"] is True
    assert body["aliases"]["trainer_records"]["completion_len_p90"] == "completion/len_p90"
