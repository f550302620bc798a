"""Before its first step a run page says what the run is doing (the launcher's phase, ``phase.json``),
and does not warn that the run directory is missing while it exists (it has no records yet)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from fastapi.testclient import TestClient

from pipelinerl.platform.run_phase import read_phase, write_phase
from pipelinerl.platform.tracking.store import PlatformStore
from pipelinerl.ui.app import UiSettings, create_app

RUN_ID = "20261126-004000-pipeline-0a1b2c"


def test_a_phase_is_written_and_read_back(tmp_path: Path) -> None:
    assert read_phase(tmp_path) is None
    write_phase(tmp_path, "measuring held-out success of the starting policy")
    phase = read_phase(tmp_path)
    assert phase is not None and phase.text == "measuring held-out success of the starting policy"
    (tmp_path / "phase.json").write_text("{damaged")
    assert read_phase(tmp_path) is None
    write_phase(tmp_path / "gone", "anything")  # a run directory that is gone is no error


def test_the_run_page_says_what_a_run_does_before_its_first_step(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'platform.db'}"
    runs = tmp_path / "runs"
    config = {"run": {"mode": "pipeline", "output_dir": str(runs)}}
    with PlatformStore(url) as store:
        store.create_run(RUN_ID, "pipelinerl", "pipeline", config, datetime.now(UTC))
    run_dir = runs / RUN_ID
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(config))  # what the launcher writes first
    write_phase(run_dir, "measuring held-out success of the starting policy")
    with TestClient(create_app(UiSettings(database_url=url))) as client:
        live = client.get(f"/api/runs/{RUN_ID}/live").json()
        assert live["phase"]["text"] == "measuring held-out success of the starting policy"
        assert live["phase"]["for_s"] >= 0
        assert not any("not found" in warning for warning in live["warnings"]), live["warnings"]
        heatmap = client.get(f"/api/runs/{RUN_ID}/lag-by-position").json()
        assert heatmap["warnings"] == []
        assert 'id="run-phase"' in client.get(f"/runs/{RUN_ID}").text
        with PlatformStore(url) as store:
            store.finish_run(RUN_ID, "finished", datetime.now(UTC), {})
        assert client.get(f"/api/runs/{RUN_ID}/live").json()["phase"] is None  # only while running
