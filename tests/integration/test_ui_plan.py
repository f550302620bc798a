"""The dashboard's Plan page in a real headless browser (chromium through selenium, as test_ui.py):
make a small sweep from the form, see it drawn and recommended as the API saved it, see a bad cluster
named beside the form; and a planned run's page with its prediction beside what it measured.

Screenshots go where test_ui.py's go (``$PIPELINERL_TEST_ARTIFACTS/ui``, default
``.cache/test-artifacts/ui``): ``plan.png``, ``plan-error.png``, ``run-prediction.png``.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.support.ui import Select

from pipelinerl.platform.run_phase import write_phase
from pipelinerl.platform.tracking.store import PlatformStore
from pipelinerl.ui.app import UiSettings
from pipelinerl.ui.load_benchmark import BackgroundServer, fill_synthetic_run
from tests.browser import headless_chromium, screenshot_dir, trace_count
from tests.conftest import wait_until, worker_port
from tests.integration.test_ui import colour_pixels, screenshot

PORT = worker_port(27010)
SETTINGS = ["rl.batch_size=64", "rl.group_size=8", "run.max_steps=8"]
PIPELINE_COLOUR = "#1f77b4"  # dashboard.js MODE_COLOURS


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with headless_chromium() as session:
        yield session


@pytest.fixture(scope="module")
def artifacts() -> Path:
    return screenshot_dir("ui")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ui-plan")


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[BackgroundServer]:
    run = fill_synthetic_run(root, 6, with_mlflow=False)
    settings = UiSettings(database_url=run.database_url, plans_home=root / "home", poll_interval_s=1.0)
    with BackgroundServer(settings, PORT) as running:
        yield running


def api_json(server: BackgroundServer, path: str) -> Any:
    with urllib.request.urlopen(server.url + path, timeout=30) as response:
        return json.loads(response.read())


def fill(browser: Any, element_id: str, text: str) -> None:
    field = browser.find_element("id", element_id)
    field.clear()
    field.send_keys(text)


def submit_and_wait(browser: Any) -> None:
    browser.find_element("id", "plan-submit").click()
    wait_until(
        lambda: (
            browser.find_element("id", "plan-submit").is_enabled()
            and browser.find_element("id", "plan-status").text != "simulating…"
        ),
        120,
        "the plan to be made",
    )


def test_a_sweep_made_on_the_page_is_drawn_and_recommended_as_saved(
    server: BackgroundServer,
    browser: Any,
    artifacts: Path,
) -> None:
    browser.get(server.url + "/plan")
    no_plans = browser.find_element("id", "no-plans")
    wait_until(no_plans.is_displayed, 30, "the page to say there are no plans yet")
    assert "pipelinerl plan" in no_plans.text and "plan flow" in no_plans.text
    assert browser.find_element("link text", "plan").get_attribute("href") == server.url + "/plan"

    Select(browser.find_element("id", "plan-profile")).select_by_value("h100-7b")
    fill(browser, "plan-cluster", "actors=8xH100,trainers=8xH100")
    fill(browser, "plan-lengths", "loglogistic:300,900")
    fill(browser, "plan-sweep", "actor_gpus=4..12:4")
    fill(browser, "plan-settings", "\n".join(SETTINGS))
    ticked = [
        box.get_attribute("value")
        for box in browser.find_elements("css selector", "input[name=modes]")
        if box.is_selected()
    ]
    assert ticked == ["pipeline", "colocated"], "the default modes"
    submit_and_wait(browser)
    assert browser.find_element("id", "plan-error").is_displayed() is False
    wait_until(lambda: trace_count(browser, "chart-plan-speed") == 3, 30, "two modes and the recommendation")
    wait_until(lambda: trace_count(browser, "chart-plan-idle") == 4, 30, "actor and trainer idle per mode")

    name = urllib.parse.parse_qs(urllib.parse.urlparse(browser.current_url).query)["name"][0]
    assert name.endswith("-sweep") and browser.find_element("id", "plan-status").text == f"saved as {name}"
    saved = api_json(server, f"/api/plans/{name}")
    [listed] = api_json(server, "/api/plans")["plans"]
    assert listed["name"] == name
    assert browser.find_element("id", "plan-recommended").text == f"actor_gpus={saved['recommended']}"
    assert browser.find_element("id", "plan-reason").text == saved["reason"]
    assert browser.find_element("id", "plan-first-mode").text == "pipeline"
    styles = browser.execute_script(
        "return document.getElementById('chart-plan-idle').data.map(t => [t.name, t.line.dash || 'solid']);"
    )
    assert dict(styles) == {
        "pipeline actor idle": "solid",
        "pipeline trainer idle": "dash",
        "colocated actor idle": "solid",
        "colocated trainer idle": "dash",
    }
    rows = browser.find_elements("css selector", "#plan-points tbody tr")
    assert [(row.get_attribute("data-value"), row.get_attribute("data-mode")) for row in rows] == [
        (str(value), mode) for value in (4, 8, 12) for mode in ("pipeline", "colocated")
    ]
    marked = {row.get_attribute("data-value") for row in rows if "recommended" in row.get_attribute("class")}
    assert marked == {str(saved["recommended"])}
    listed_row = browser.find_element("css selector", f"#plans tr[data-plan-name='{name}']")
    assert "selected" in listed_row.get_attribute("class")
    assert listed_row.find_elements("css selector", "td")[-1].text == f"actor_gpus={saved['recommended']}"
    png = screenshot(browser, artifacts, "plan")
    assert colour_pixels(png, browser, "chart-plan-speed", PIPELINE_COLOUR) > 50, (
        "the pipeline curve is drawn"
    )

    # the page of the saved plan draws the same, from the list
    browser.get(f"{server.url}/plan?name={name}")
    wait_until(lambda: trace_count(browser, "chart-plan-speed") == 3, 30, "the saved plan's chart")
    assert browser.find_element("id", "plan-recommended").text == f"actor_gpus={saved['recommended']}"


def test_a_bad_cluster_is_named_beside_the_form(
    server: BackgroundServer,
    browser: Any,
    artifacts: Path,
) -> None:
    browser.get(server.url + "/plan")
    fill(browser, "plan-cluster", "actors=8xB300,trainers=8xB300")
    fill(browser, "plan-settings", "\n".join(SETTINGS))
    plans_before = len(api_json(server, "/api/plans")["plans"])
    submit_and_wait(browser)
    error = browser.find_element("id", "plan-error")
    wait_until(error.is_displayed, 30, "the error beside the form")
    assert "B300" in error.text and "unknown GPU" in error.text, error.text
    assert len(api_json(server, "/api/plans")["plans"]) == plans_before, "nothing saved"
    screenshot(browser, artifacts, "plan-error")
    fill(browser, "plan-cluster", "actors=8xH100,trainers=8xH100")
    submit_and_wait(browser)
    assert not error.is_displayed(), "the error goes once the plan is made"
    wait_until(lambda: browser.find_elements("css selector", "#plan-runs tbody tr"), 30, "the plain plan")
    modes = [
        row.get_attribute("data-mode") for row in browser.find_elements("css selector", "#plan-runs tbody tr")
    ]
    assert modes == ["pipeline", "colocated"]
    assert "samples/s of colocated" in browser.find_element("id", "plan-speedups").text


def test_a_planned_runs_page_shows_its_prediction_beside_what_it_measured(
    server: BackgroundServer,
    root: Path,
    browser: Any,
    artifacts: Path,
) -> None:
    [run] = api_json(server, "/api/runs")["runs"]
    prediction = {
        "profile": "h100-7b",
        "lengths": f"run:{run['id']}",
        "mode": "pipeline",
        "predicted": {
            "steady_samples_per_s": 12.0,
            "actor_idle": 0.2,
            "steady_trainer_idle": 0.1,
            "trainer_idle": 0.3,
            "lag_mean": 1.5,
            "lag_max": 4,
        },
        "measured": {
            "steady_samples_per_s": 10.0,
            "trainer_idle": 0.15,
            "actor_idle": 0.25,
            "lag_mean": 2.0,
            "lag_max": 5,
        },
    }
    (root / "runs" / run["id"] / "plan_prediction.json").write_text(json.dumps(prediction))
    browser.get(f"{server.url}/runs/{run['id']}")
    section = browser.find_element("id", "prediction")
    wait_until(section.is_displayed, 30, "the predicted vs measured table")
    rows = [
        [cell.text for cell in row.find_elements("css selector", "td")]
        for row in browser.find_elements("css selector", "#prediction-table tbody tr")
    ]
    assert rows[0] == ["samples/s after the first step", "12.00", "10.00", "+2.00 (+20 %)"]
    assert [row[0] for row in rows] == [
        "samples/s after the first step",
        "actor idle",
        "trainer idle after the first step",
        "lag mean",
        "lag max",
    ]
    assert rows[-1][1:] == ["4", "5", "-1 (-20 %)"]
    screenshot(browser, artifacts, "run-prediction")


def test_before_its_first_step_a_run_page_says_what_the_run_is_doing(
    server: BackgroundServer, root: Path, browser: Any, artifacts: Path
) -> None:
    """A running run with no step yet (its starting evaluation: minutes on a big model): the page says
    so, in a box that stands out, and warns of no missing run directory (it exists, without records)."""
    run_id = "20261126-004500-pipeline-f00d00"
    runs = root / "runs"
    config = {"run": {"mode": "pipeline", "output_dir": str(runs)}}
    [first] = api_json(server, "/api/runs")["runs"]
    with PlatformStore(f"sqlite:///{root / 'platform.db'}") as store:  # fill_synthetic_run's database
        store.create_run(run_id, "pipelinerl", "pipeline", config, datetime.now(UTC))
    (runs / run_id).mkdir(parents=True)
    (runs / run_id / "config.json").write_text(json.dumps(config))
    write_phase(runs / run_id, "measuring held-out success of the starting policy")
    browser.get(f"{server.url}/runs/{run_id}")
    phase = browser.find_element("id", "run-phase")
    wait_until(phase.is_displayed, 30, "the run's phase")
    assert phase.text.startswith("Before the first step: measuring held-out success of the starting policy")
    assert "not found" not in browser.find_element("id", "run-warnings").text
    screenshot(browser, artifacts, "run-before-first-step")
    assert first["id"] != run_id
