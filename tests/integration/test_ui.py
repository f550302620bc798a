"""The dashboard on a real comparison (pipeline against conventional, real processes and stores),
driven in a real headless browser (Debian's chromium + chromium-driver, through selenium) and
through its JSON API.

One comparison runs for the whole module, in a background thread: the first test watches the
pipeline run's page while it trains (its policy version rises on screen, without a reload); the
others wait for the comparison to finish. Screenshots go to ``$PIPELINERL_TEST_ARTIFACTS/ui``
(default: ``.cache/test-artifacts/ui`` in the repository, which git ignores).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from mlflow.tracking import MlflowClient
from PIL import Image

from pipelinerl.launch.compare import run_comparison
from pipelinerl.platform.config import PipelineConfig, load_config
from pipelinerl.platform.tracking.mlflow_store import mlflow_uri
from pipelinerl.platform.tracking.ratios import times_faster
from pipelinerl.platform.tracking.store import PlatformStore
from pipelinerl.ui.app import UiSettings, create_app, settings_from_config
from pipelinerl.ui.load_benchmark import BackgroundServer
from tests.browser import headless_chromium, screenshot_dir, trace_count
from tests.conftest import wait_until, worker_port

# The tests after the first wait for the comparison to finish (about a minute and a half here).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DASHBOARD_PORT = worker_port(27000)
DEAD_DATABASE_PORT = worker_port(27001)
RUN_BASE_PORT = worker_port(27020)
STEPS = 24
CHECKPOINT_EVERY = 8
REPOSITORY = Path(__file__).resolve().parents[2]


# ----- the comparison, running in the background -----


@dataclass
class Comparison:
    config: PipelineConfig
    thread: threading.Thread | None = None
    outcome: dict[str, Any] = field(default_factory=dict)

    def result(self, timeout_s: float = 600) -> Any:
        assert self.thread is not None
        self.thread.join(timeout=timeout_s)
        assert not self.thread.is_alive(), f"the comparison did not finish within {timeout_s:.0f} s"
        if "error" in self.outcome:
            raise self.outcome["error"]
        return self.outcome["result"]


@pytest.fixture(scope="module")
def comparison(tmp_path_factory: pytest.TempPathFactory, random_model_dir: Path) -> Iterator[Comparison]:
    root = tmp_path_factory.mktemp("ui-run")
    config = load_config(
        None,
        [
            f"model.path={random_model_dir}",
            f"run.output_dir={root / 'runs'}",
            f"run.home={root / 'home'}",
            f"tracking.database_url=sqlite:///{root / 'platform.db'}",
            f"tracking.mlflow_uri=sqlite:///{root / 'mlflow.db'}",
            f"run.max_steps={STEPS}",
            "run.steps_per_round=2",
            "rl.group_size=4",
            "rl.batch_size=16",
            "actor.max_in_flight=16",
            "task.eval_problems=16",
            f"trainer.checkpoint_every={CHECKPOINT_EVERY}",
            "tracking.flush_interval_s=0.5",  # the database follows the run closely: the page can rise
            f"transport.base_port={RUN_BASE_PORT}",
        ],
    )
    running = Comparison(config)

    def run() -> None:
        try:
            running.outcome["result"] = run_comparison(config, ["pipeline", "conventional"])
        except BaseException as error:  # handed to the test that asks for the result
            running.outcome["error"] = error

    running.thread = threading.Thread(target=run, name="comparison", daemon=True)
    running.thread.start()
    yield running
    running.thread.join(timeout=600)


@pytest.fixture(scope="module")
def settings(comparison: Comparison) -> UiSettings:
    # What `pipelinerl ui --config ...` resolves; a fast refresh so the test sees each step.
    resolved = settings_from_config(comparison.config)
    return UiSettings(
        database_url=resolved.database_url,
        mlflow_uri=resolved.mlflow_uri,
        mlflow_ui_url=resolved.mlflow_ui_url,
        prefect_ui_url=resolved.prefect_ui_url,
        poll_interval_s=1.0,
    )


@pytest.fixture(scope="module")
def server(settings: UiSettings) -> Iterator[BackgroundServer]:
    with BackgroundServer(settings, DASHBOARD_PORT) as running:
        yield running


@pytest.fixture(scope="module")
def api(settings: UiSettings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as client:
        yield client


# ----- the browser -----


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with headless_chromium() as session:
        yield session


@pytest.fixture(scope="module")
def artifacts() -> Path:
    return screenshot_dir("ui")


def screenshot(browser: Any, artifacts: Path, name: str) -> Path:
    path = artifacts / f"{name}.png"
    assert browser.save_screenshot(str(path)), f"no screenshot saved at {path}"
    return path


def colour_pixels(png: Path, browser: Any, element_id: str, colour: str, tolerance: int = 40) -> int:
    """Pixels of ``colour`` (#rrggbb) inside the element: the chart's traces are really drawn."""
    rect = browser.find_element("id", element_id).rect
    scale = browser.execute_script("return window.devicePixelRatio") or 1
    with Image.open(png) as image:
        box = tuple(
            int(v * scale)
            for v in (rect["x"], rect["y"], rect["x"] + rect["width"], rect["y"] + rect["height"])
        )
        pixels = np.asarray(image.convert("RGB").crop(box), dtype=np.int32)
    target = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(pixels - target).sum(axis=2) < tolerance).sum())


# ----- the tests (in this order: the first one needs the run still going) -----


def test_the_run_page_updates_while_the_run_is_in_progress(
    comparison: Comparison, server: BackgroundServer, api: TestClient, browser: Any, artifacts: Path
) -> None:
    def running_pipeline_run() -> str | None:
        response = api.get("/api/runs?mode=pipeline&status=running")
        runs = response.json()["runs"] if response.status_code == 200 else []
        return runs[0]["id"] if runs else None

    run_id = wait_until(running_pipeline_run, 300, "the pipeline run to start")
    browser.get(f"{server.url}/runs/{run_id}")
    browser.execute_script("window.loadedOnce = true")  # gone if the page reloaded

    def shown_version() -> int | None:
        text = browser.find_element("id", "policy-version").text
        return int(text) if text.isdigit() else None

    first = wait_until(shown_version, 300, "a first policy version on the page", interval_s=0.1)
    assert first < STEPS, "the page was first seen after the run had finished"
    later = wait_until(
        lambda: (version := shown_version()) is not None and version > first and version,
        120,
        "a higher version",
    )
    assert later > first
    assert browser.execute_script("return window.loadedOnce === true"), "the page reloaded"
    wait_until(lambda: trace_count(browser, "chart-ess") >= 1, 30, "the ESS chart")
    wait_until(lambda: trace_count(browser, "chart-lag-heatmap") >= 1, 30, "the lag heat map")
    png = screenshot(browser, artifacts, "run-live")
    assert colour_pixels(png, browser, "chart-ess", "#2ca02c") > 50, "the ESS curve is drawn"
    assert browser.find_element("id", "banner").get_attribute("hidden") is not None


def test_the_api_on_a_real_comparison(comparison: Comparison, api: TestClient) -> None:
    result = comparison.result()
    parent = result.comparison_id
    children = api.get(f"/api/runs?parent={parent}").json()["runs"]
    assert sorted(run["mode"] for run in children) == ["conventional", "pipeline"]
    assert all(run["status"] == "finished" and run["policy_version"] == STEPS for run in children)
    pipeline_run = result.results["pipeline"]
    run_id = pipeline_run.run_dir.name

    steps = api.get(f"/api/runs/{run_id}/steps").json()
    assert steps["version"] == list(range(1, STEPS + 1))
    by_version = {r["policy_version"]: r for r in pipeline_run.records}
    assert steps["ess"] == pytest.approx([by_version[v]["rl/ess"] for v in steps["version"]])
    assert steps["samples_trained"] == [by_version[v]["samples/trained"] for v in steps["version"]]

    # The newest step's lag histogram, recomputed from the tokens the trainer saved for that step.
    histogram = api.get(f"/api/runs/{run_id}/lag-histogram").json()
    assert histogram["version"] == STEPS
    tokens = np.load(pipeline_run.run_dir / "tokens" / f"step_{STEPS:06d}_rank0.npz")
    lags = np.bincount(int(tokens["trained_at_version"]) - tokens["token_versions"].astype(np.int64))
    assert dict(zip(histogram["lag"], histogram["count"], strict=True)) == {
        lag: int(count) for lag, count in enumerate(lags) if count
    }

    heat = api.get(f"/api/runs/{run_id}/lag-by-position").json()
    assert heat["warnings"] == [] and heat["versions"] == list(range(1, STEPS + 1))
    assert [row[-1] for row in heat["mean_lag"]] == by_version[STEPS]["lag/by_position"]

    live = api.get(f"/api/runs/{run_id}/live").json()
    assert live["warnings"] == []
    assert [m["sequences"] for m in live["multi_version_sequences"]] == [
        by_version[v]["trainer/inflight_sequences"] for v in range(1, STEPS + 1)
    ]
    assert sum(m["sequences"] for m in live["multi_version_sequences"]) > 0, "some sequences span versions"
    assert {c["version"] for c in live["checkpoints"]} >= set(
        range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY)
    )
    assert live["stages"]["actor"]["tokens_per_s"] > 0, "from the actor's metrics in MLflow"
    assert any(p["pause_ms"] is not None for p in live["pauses"]), "the actor's in-flight update pauses"
    assert [e["name"] for e in live["evals"]] == ["eval/success"]
    # The start and end evaluations sit where their policies were trained: the start at 0 s, the
    # final policy at its last step (not minutes later, when its evaluation finished).
    [success] = live["evals"]
    assert success["version"] == [0, STEPS]
    assert success["wall_s"] == [0.0, steps["wall_s"][-1]]
    assert success["samples_trained"] == [0, steps["samples_trained"][-1]]

    compared = api.get(f"/api/compare?run={parent}").json()
    assert [run["label"] for run in compared["runs"]] == ["pipeline", "conventional"]
    assert compared["table"]["baselines"] == ["conventional"]
    for run in compared["runs"]:  # the conventional run's final evaluation too
        [success] = run["evals"]
        assert success["wall_s"][-1] == run["steps"]["wall_s"][-1]
    # The terminal's table and the dashboard's: the same ratio by the same name, same baseline.
    terminal = {row.label: row.times_faster_than["conventional-G2"] for row in result.rows}
    dashboard = {row["label"]: row["times_faster_than"]["conventional"] for row in compared["table"]["rows"]}
    assert dashboard["conventional"] == terminal["conventional-G2"] == 1.0
    assert (dashboard["pipeline"] is None) == (terminal["pipeline"] is None)
    run = api.get(f"/api/runs/{run_id}").json()
    assert run["links"]["mlflow"].endswith(f"/runs/{run['mlflow_run_id']}?workflowType=machine_learning")


def test_the_comparison_ranks_each_run_against_conventional_under_one_mlflow_parent(
    comparison: Comparison,
) -> None:
    """``compare``: the two runs as child MLflow runs under one parent, each run's ratio against the
    conventional run (its time to the target ÷ the run's) and the table's figures from the runs."""
    result = comparison.result()
    assert [row.label for row in result.rows] == ["pipeline", "conventional-G2"]
    pipeline, conventional = result.rows
    # One ratio, one direction: each run against the conventional run, its time ÷ the run's.
    assert conventional.times_faster_than == {"conventional-G2": 1.0}
    expected = times_faster(run_s=pipeline.time_to_target_s, baseline_s=conventional.time_to_target_s)
    assert pipeline.times_faster_than == {"conventional-G2": expected}
    assert conventional.ess_mean == result.results["conventional-G2"].summary["ess_mean"]
    assert conventional.lag_max <= 1

    client = MlflowClient(tracking_uri=mlflow_uri(comparison.config))
    parent = client.get_run(result.mlflow_run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["kind"] == "compare"
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{result.mlflow_run_id}'"
    )
    assert sorted(child.data.tags["mode"] for child in children) == ["conventional", "pipeline"]
    # Named by what they are, so MLflow's chart view tells them apart.
    assert sorted(child.info.run_name for child in children) == ["conventional-G2", "pipeline"]
    assert all(child.info.status == "FINISHED" for child in children)


def test_the_runs_list_shows_a_finished_run(
    comparison: Comparison, server: BackgroundServer, browser: Any, artifacts: Path
) -> None:
    run_id = comparison.result().results["conventional-G2"].run_dir.name
    browser.get(server.url + "/")
    row = f"tr[data-run-id='{run_id}']"
    wait_until(lambda: browser.find_elements("css selector", row), 30, f"the row of {run_id}")
    cells = [cell.text for cell in browser.find_elements("css selector", f"{row} td")]
    assert cells[3:6] == ["conventional", "finished", str(STEPS)], cells
    screenshot(browser, artifacts, "runs")
    browser.get(server.url + "/?mode=pipeline")  # what choosing "pipeline" in the mode filter loads
    wait_until(lambda: browser.find_elements("css selector", "#runs tbody tr"), 30, "the filtered list")
    modes = {cell.text for cell in browser.find_elements("css selector", "#runs tbody tr td:nth-child(4)")}
    assert modes == {"pipeline"}
    assert browser.find_element("css selector", "select[name=mode]").get_attribute("value") == "pipeline"


def test_the_compare_page_of_a_compare_parent_overlays_both_modes(
    comparison: Comparison, server: BackgroundServer, browser: Any, artifacts: Path
) -> None:
    parent = comparison.result().comparison_id
    browser.get(f"{server.url}/runs/{parent}")  # a compare parent's page is its comparison
    assert "/compare?run=" in browser.current_url
    wait_until(lambda: trace_count(browser, "chart-lag") == 4, 30, "both runs in the lag chart")
    traces = browser.execute_script(
        "return document.getElementById('chart-ess').data.map(t => [t.name, t.line.color]);"
    )
    colours = dict(traces)
    assert set(colours) == {"pipeline", "conventional"}
    assert colours["pipeline"] != colours["conventional"]
    rows = browser.find_elements("css selector", "#compare-table tbody tr")
    assert [row.find_element("css selector", "td").text for row in rows] == ["pipeline", "conventional"]
    header = browser.find_element("css selector", "#compare-table thead").text
    assert "× faster than conventional" in header, header
    cells = [cell.text for cell in rows[1].find_elements("css selector", "td")]
    assert cells[4] == "1.00×", f"the baseline against itself: {cells}"
    png = screenshot(browser, artifacts, "compare")
    for label in ("pipeline", "conventional"):
        assert colour_pixels(png, browser, "chart-lag", colours[label]) > 50, (
            f"the {label} lag curve is drawn"
        )
    # the run page as it ends up
    browser.get(f"{server.url}/runs/{comparison.result().results['pipeline'].run_dir.name}")
    wait_until(lambda: trace_count(browser, "chart-lag-heatmap") >= 1, 30, "the run page's charts")
    time.sleep(1)
    screenshot(browser, artifacts, "run")


def test_an_unknown_run_says_so(server: BackgroundServer, browser: Any) -> None:
    browser.get(server.url + "/runs/20991231-000000-pipeline-nosuch")
    message = browser.find_element("id", "not-found").text
    assert message == "no run '20991231-000000-pipeline-nosuch' in the platform database"


def test_an_unreachable_database_gives_a_banner_and_the_page_recovers(tmp_path: Path, browser: Any) -> None:
    database = tmp_path / "not-yet" / "platform.db"
    url = f"sqlite:///{database}"
    with BackgroundServer(UiSettings(database_url=url, poll_interval_s=1.0), DEAD_DATABASE_PORT) as dead:
        browser.get(dead.url + "/")
        banner = browser.find_element("id", "banner")
        wait_until(lambda: banner.is_displayed() and "not-yet/platform.db" in banner.text, 30, "the banner")
        assert "Platform database unreachable" in banner.text and "retrying" in banner.text
        database.parent.mkdir()
        with PlatformStore(url) as store:
            store.create_run("20261122-000000-pipeline-back", "back", "pipeline", {}, datetime.now(UTC))
        wait_until(lambda: not banner.is_displayed(), 30, "the banner to go once the database answers")
        wait_until(
            lambda: browser.find_elements("css selector", "tr[data-run-id='20261122-000000-pipeline-back']"),
            30,
            "the run to be listed",
        )
