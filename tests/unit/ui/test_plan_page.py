"""The Plan page's API (list, read, make a plan from the form; bad input, limits, paths that are not
plans) and the run page's prediction beside what the run measured (``plan_prediction.json``)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from pipelinerl.plan.report import save_plan
from pipelinerl.platform.config import load_config
from pipelinerl.ui.app import UiSettings, create_app, settings_from_config
from pipelinerl.ui.load_benchmark import fill_synthetic_run
from pipelinerl.ui.plans import MAX_CLUSTER_GPUS, MAX_PLAN_STEPS, MAX_SIMULATED_SAMPLES, MAX_SWEEP_VALUES
from pipelinerl.ui.run_files import read_prediction

SMALL = ["rl.batch_size=64", "rl.group_size=8", "run.max_steps=8"]
SWEEP_FORM = {
    "profile": "h100-7b",
    "cluster": "actors=8xH100,trainers=8xH100",
    "lengths": "loglogistic:300,900",
    "sweep": "actor_gpus=4..12:4",
    "modes": ["pipeline", "colocated"],
    "settings": "\n".join(SMALL),
    "prompt_tokens": 100,
}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def client(tmp_path: Path, home: Path) -> Iterator[TestClient]:
    settings = UiSettings(database_url=f"sqlite:///{tmp_path / 'platform.db'}", plans_home=home)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def detail(response: Any) -> str:
    return str(response.json()["detail"])


def test_settings_from_config_read_the_plans_of_the_platform_home(tmp_path: Path) -> None:
    config = load_config(None, [f"run.home={tmp_path / 'platform-home'}"])
    assert settings_from_config(config).plans_home == tmp_path / "platform-home"


def test_no_plans_yet_the_page_says_how_to_make_one(client: TestClient, home: Path) -> None:
    body = client.get("/api/plans").json()
    assert body == {"home": str(home / "plans"), "plans": [], "warnings": []}
    page = client.get("/plan")
    assert page.status_code == 200
    html = page.text
    assert (
        'id="no-plans"' in html and "pipelinerl plan -p h100-7b" in html and "<code>plan</code> flow" in html
    )
    for default in ("actors=48xH100,trainers=80xH100", "loglogistic:1200,3500", "rl.batch_size=1024"):
        assert default in html
    assert '<option value="h100-7b" selected>' in html and '<option value="h200-32b"' in html
    assert 'value="pipeline" checked' in html and 'value="colocated" checked' in html
    assert 'value="async">' in html, "a mode not ticked by default"
    assert '<a href="/plan">plan</a>' in client.get("/compare").text, "the navigation links the page"


def test_a_sweep_made_from_the_form_is_saved_listed_and_read_back(client: TestClient, home: Path) -> None:
    response = client.post("/api/plan", json=SWEEP_FORM)
    assert response.status_code == 200, response.text
    made = response.json()
    name, plan = made["name"], made["plan"]
    assert name.endswith("-sweep") and (home / "plans" / f"{name}.json").is_file()
    assert plan["swept"] == "actor_gpus" and [p["value"] for p in plan["points"]] == [4, 8, 12]
    assert plan["recommended"] in (4, 8, 12) and plan["reason"].startswith(
        f"actor_gpus={plan['recommended']}"
    )
    assert (
        plan["asked"]["cluster"] == "actors=8xH100,trainers=8xH100" and plan["asked"]["prompt_tokens"] == 100
    )
    assert set(plan["points"][0]["runs"]) == {"pipeline", "colocated"}
    assert plan["points"][0]["cluster"] == "actors=4xH100,trainers=12xH100"
    best = max(plan["points"], key=lambda p: p["runs"]["pipeline"]["samples_per_s"])
    assert best["value"] == plan["recommended"], "the recommendation is the first mode's best"

    assert client.get(f"/api/plans/{name}").json() == plan
    [listed] = client.get("/api/plans").json()["plans"]
    assert listed["name"] == name and listed["kind"] == "sweep" and listed["profile"] == "h100-7b"
    assert listed["swept"] == "actor_gpus" and listed["recommended"] == plan["recommended"]
    assert listed["sweep"] == "actor_gpus=4..12:4" and listed["created"].endswith("+00:00")
    page = client.get(f"/plan?name={name}")
    assert page.status_code == 200 and f"Dashboard.planPage({json.dumps(name)})" in page.text


def test_a_plain_plan_has_each_mode_and_the_speedups_and_the_newest_comes_first(
    client: TestClient, home: Path
) -> None:
    older = save_plan(home, {"asked": {"profile": "old"}, "runs": {}, "speedups": {}}, name="plan")
    os.utime(older, (time.time() - 60, time.time() - 60))
    form = {**SWEEP_FORM, "sweep": "", "modes": ["pipeline", "conventional", "colocated"], "name": "mine"}
    made = client.post("/api/plan", json=form).json()
    assert made["name"].endswith("-mine")
    plan = made["plan"]
    assert list(plan["runs"]) == ["pipeline", "conventional", "colocated"] and "points" not in plan
    assert set(plan["speedups"]) == {"conventional", "colocated"}
    pipeline, colocated = plan["runs"]["pipeline"], plan["runs"]["colocated"]
    assert plan["speedups"]["colocated"] == pytest.approx(
        pipeline["samples_per_s"] / colocated["samples_per_s"]
    )
    names = [p["name"] for p in client.get("/api/plans").json()["plans"]]
    assert names == [made["name"], older.stem], "newest first, also within one second"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"cluster": "actors=8xB300,trainers=8xB300"}, "B300"),
        ({"cluster": "actors=8xH100"}, "trainers missing"),
        ({"cluster": "actors=7xH100,trainers=8xH200"}, "H200"),
        ({"profile": "h100-70b"}, "h100-70b"),
        ({"profile": "/etc/hostname"}, "/etc/hostname"),  # never a file on the server
        ({"lengths": "loglogistic:900,300"}, "median=900"),
        ({"lengths": "run:/tmp"}, "run:/tmp"),
        ({"sweep": "actor_gpus=4..20:4"}, "actor_gpus=16"),  # 16 of 16 GPUs act: none would train
        ({"sweep": "actor.max_in_fligth=8,16"}, "max_in_fligth"),
        ({"sweep": "actor_gpus"}, "actor_gpus"),
        ({"modes": ["pipeline", "warp"]}, "warp"),
        ({"modes": []}, "modes"),
        ({"settings": "rl.batch_sise=64"}, "batch_sise"),
        ({"settings": "rl.batch_size=-4"}, "rl.batch_size"),
        ({"settings": "no equals sign"}, "no equals sign"),
        ({"prompt_tokens": "many"}, "prompt_tokens"),
        ({"name": "../escape"}, "name"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_input_is_a_400_naming_the_value(
    client: TestClient, home: Path, change: dict, named: str
) -> None:
    response = client.post("/api/plan", json={**SWEEP_FORM, **change})
    assert response.status_code == 400, response.text
    assert named in detail(response)
    assert not list((home / "plans").glob("*.json")), "nothing saved"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            {"settings": "\n".join([*SMALL, f"run.max_steps={MAX_PLAN_STEPS + 1}"])},
            f"at most {MAX_PLAN_STEPS}",
        ),
        ({"sweep": "run.max_steps=8,5000"}, f"at most {MAX_PLAN_STEPS}"),
        ({"sweep": f"actor.max_in_flight=1..{MAX_SWEEP_VALUES + 1}"}, f"at most {MAX_SWEEP_VALUES}"),
        ({"sweep": "actor.max_in_flight=1..1000000000000000"}, f"at most {MAX_SWEEP_VALUES}"),  # not listed
        ({"sweep": ",".join(str(v) for v in range(1, 70)).join(["actor.max_in_flight=", ""])}, "69 values"),
        ({"cluster": f"actors={MAX_CLUSTER_GPUS}xH100,trainers=8xH100"}, f"at most {MAX_CLUSTER_GPUS}"),
        ({"settings": "rl.batch_size=4096\nrl.group_size=8\nrun.max_steps=2000", "sweep": ""}, "samples"),
    ],
)
def test_plans_larger_than_a_request_simulates_are_refused_naming_the_limit(
    client: TestClient, change: dict, named: str
) -> None:
    started = time.monotonic()
    response = client.post("/api/plan", json={**SWEEP_FORM, **change})
    assert response.status_code == 400, response.text
    assert named in detail(response)
    assert time.monotonic() - started < 10, "refused before simulating"


def test_the_samples_limit_counts_values_and_modes(client: TestClient) -> None:
    # 64 values of 1024 x 40 samples in two modes: over the limit though each value is small
    settings = "rl.batch_size=1024\nrl.group_size=8\nrun.max_steps=40"
    response = client.post(
        "/api/plan", json={**SWEEP_FORM, "settings": settings, "sweep": "actor.max_in_flight=8..71"}
    )
    assert response.status_code == 400
    assert f"{1024 * 40 * 64 * 2:,} samples" in detail(response)
    assert f"{MAX_SIMULATED_SAMPLES:,}" in detail(response)


@pytest.mark.parametrize(
    "name",
    [
        "..%2F..%2Fsecret",
        "..%2Fsecret",
        "%2E%2E",
        "secret.json",
        ".hidden",
        "x%00y",
        "-rf",
        "a" * 200,
    ],
)
def test_a_plan_name_that_is_not_a_file_stem_never_reads_outside_the_plans(
    client: TestClient, home: Path, name: str
) -> None:
    home.mkdir(parents=True)
    (home / "secret.json").write_text(json.dumps({"asked": {"profile": "secret"}}))
    save_plan(home, {"asked": {"profile": "h100-7b"}, "runs": {}, "speedups": {}})
    response = client.get(f"/api/plans/{name}")
    assert response.status_code in (400, 404), response.text
    assert "secret" not in json.dumps(response.json().get("detail", "")).replace(name, "")
    page = client.get(f"/plan?name={name}")
    assert page.status_code in (404, 422) and '"profile": "secret"' not in page.text


def test_an_unknown_plan_is_a_404_naming_it(client: TestClient) -> None:
    response = client.get("/api/plans/20260101-000000-nosuch")
    assert response.status_code == 404
    assert "'20260101-000000-nosuch'" in detail(response)
    page = client.get("/plan?name=20260101-000000-nosuch")
    assert page.status_code == 404 and "20260101-000000-nosuch" in page.text


def test_a_damaged_plan_file_is_named_not_fatal(client: TestClient, home: Path) -> None:
    good = save_plan(home, {"asked": {"profile": "h100-7b"}, "runs": {}, "speedups": {}})
    (home / "plans" / "20000101-000000-broken.json").write_text("{not json")
    body = client.get("/api/plans").json()
    assert [p["name"] for p in body["plans"]] == [good.stem]
    assert any("20000101-000000-broken" in warning for warning in body["warnings"])
    response = client.get("/api/plans/20000101-000000-broken")
    assert response.status_code == 422 and "20000101-000000-broken" in detail(response)


def test_without_a_platform_home_there_is_nothing_to_list_or_save(tmp_path: Path) -> None:
    settings = UiSettings(database_url=f"sqlite:///{tmp_path / 'platform.db'}")
    with TestClient(create_app(settings)) as client:
        listed = client.get("/api/plans").json()
        assert listed["home"] is None and listed["plans"] == [] and "plans_home" in listed["warnings"][0]
        response = client.post("/api/plan", json=SWEEP_FORM)
        assert response.status_code == 503 and "platform home" in detail(response)
        assert client.get("/api/plans/20260101-000000-plan").status_code == 404
        assert client.get("/plan").status_code == 200


# ----- the run page: predicted beside measured -----

PREDICTION = {
    "profile": "h100-7b",
    "lengths": "run:20261122-000000-pipeline-synth",
    "mode": "pipeline",
    "prompt_tokens": 100,
    "predicted": {
        "samples_per_s": 10.0,
        "steady_samples_per_s": 12.0,
        "actor_idle": 0.25,
        "trainer_idle": 0.3,
        "steady_trainer_idle": 0.1,
        "lag_mean": 1.5,
        "lag_p90": 3,
        "lag_max": 4,
    },
    "measured": {
        "steady_samples_per_s": 10.0,
        "trainer_idle": 0.2,
        "actor_idle": 0.25,
        "lag_mean": 2.0,
        "lag_max": 5,
    },
}


def test_the_prediction_is_read_beside_what_was_measured(tmp_path: Path) -> None:
    assert read_prediction(tmp_path) is None, "no file: no table"
    (tmp_path / "plan_prediction.json").write_text(json.dumps(PREDICTION))
    prediction = read_prediction(tmp_path)
    assert prediction is not None
    assert (prediction["profile"], prediction["mode"]) == ("h100-7b", "pipeline")
    rows = {row["figure"]: row for row in prediction["rows"]}
    assert list(rows) == ["steady_samples_per_s", "actor_idle", "trainer_idle", "lag_mean", "lag_max"]
    assert rows["steady_samples_per_s"]["label"] == "samples/s after the first step"
    assert (rows["steady_samples_per_s"]["predicted"], rows["steady_samples_per_s"]["measured"]) == (
        12.0,
        10.0,
    )
    assert rows["steady_samples_per_s"]["difference"] == pytest.approx(2.0)
    assert rows["steady_samples_per_s"]["relative"] == pytest.approx(0.2)
    # the measured trainer idle is from the end of the first step on: beside the predicted one of that span
    assert rows["trainer_idle"]["predicted"] == 0.1 and rows["trainer_idle"]["difference"] == pytest.approx(
        -0.1
    )
    assert rows["lag_max"]["difference"] == -1.0 and rows["actor_idle"]["relative"] == 0.0


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "",
        "[1, 2]",
        json.dumps({"predicted": "fast", "measured": {}}),
        json.dumps({**PREDICTION, "measured": None}),
        json.dumps({**PREDICTION, "predicted": {"steady_samples_per_s": "12"}}),
        json.dumps({**PREDICTION, "measured": {"lag_max": True}}),
    ],
)
def test_a_damaged_prediction_is_absent_not_an_error(tmp_path: Path, content: str) -> None:
    (tmp_path / "plan_prediction.json").write_text(content)
    assert read_prediction(tmp_path) is None


def test_a_run_too_short_to_compare_says_why(tmp_path: Path) -> None:
    (tmp_path / "plan_prediction.json").write_text(json.dumps({"error": "1 trainer steps recorded"}))
    assert read_prediction(tmp_path) == {"error": "1 trainer steps recorded", "rows": []}


def test_the_run_page_api_carries_the_prediction_when_the_run_directory_has_one(tmp_path: Path) -> None:
    run = fill_synthetic_run(tmp_path, 3, with_mlflow=False)
    settings = UiSettings(database_url=run.database_url)
    with TestClient(create_app(settings)) as client:
        assert client.get(f"/api/runs/{run.run_id}/live").json()["prediction"] is None
        (run.run_dir / "plan_prediction.json").write_text(json.dumps(PREDICTION))
        prediction = client.get(f"/api/runs/{run.run_id}/live").json()["prediction"]
        assert [row["measured"] for row in prediction["rows"]] == [10.0, 0.25, 0.2, 2.0, 5.0]
        (run.run_dir / "plan_prediction.json").write_text("{damaged")
        live = client.get(f"/api/runs/{run.run_id}/live")
        assert live.status_code == 200 and live.json()["prediction"] is None
        page = client.get(f"/runs/{run.run_id}").text
        assert 'id="prediction"' in page and "Predicted vs measured" in page


def test_only_a_json_body_makes_a_plan(client: TestClient, home: Path) -> None:
    """A page elsewhere can post a plain-text form to the dashboard without asking (no CORS check):
    such a body is refused, so only the dashboard's own page (or a script) makes plans."""
    text = json.dumps(SWEEP_FORM)
    assert client.post("/api/plan", content=text, headers={"Content-Type": "text/plain"}).status_code == 422
    assert client.post("/api/plan", json=[SWEEP_FORM]).status_code == 422
    assert not (home / "plans").exists()
