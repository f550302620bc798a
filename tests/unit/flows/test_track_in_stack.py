"""`pipelinerl run` / `compare` with the local stack up track in its MLflow server, or say why they cannot."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest
import typer

from pipelinerl.cli import _track_in_stack
from pipelinerl.flows.stack import StackState, write_state
from pipelinerl.platform.config import load_config


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the handler's API)
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def mlflow_like_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _stack(home: Path, mlflow_url: str) -> None:
    write_state(
        StackState(
            home=home,
            prefect_port=4200,
            mlflow_port=int(mlflow_url.rsplit(":", 1)[1]),
            prefect_api_url="http://127.0.0.1:4200/api",
            prefect_ui_url="http://127.0.0.1:4200",
            mlflow_url=mlflow_url,
            mlflow_store_uri=f"sqlite:///{home / 'mlflow.db'}",
            artifacts_dir=home / "mlartifacts",
            launch_pool="local",
            work_pools=["actors", "trainers"],
            ready=True,
        )
    )


def test_a_run_tracks_in_the_stack_s_mlflow_server(tmp_path, mlflow_like_server, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _stack(tmp_path, mlflow_like_server)
    config = load_config(None, [f"run.home={tmp_path}"])
    assert _track_in_stack(config).tracking.mlflow_uri == mlflow_like_server
    named = load_config(None, [f"run.home={tmp_path}", "tracking.mlflow_uri=sqlite:///elsewhere.db"])
    assert _track_in_stack(named).tracking.mlflow_uri == "sqlite:///elsewhere.db", "a named store is kept"


def test_no_stack_leaves_the_config_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = load_config(None, [f"run.home={tmp_path}"])
    assert _track_in_stack(config) is config


def test_a_stack_whose_mlflow_does_not_answer_is_an_error_naming_it(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _stack(tmp_path, "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(typer.Exit):
        _track_in_stack(load_config(None, [f"run.home={tmp_path}"]))
    assert "does not answer" in capsys.readouterr().out
