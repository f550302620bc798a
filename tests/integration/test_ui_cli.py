"""``pipelinerl ui`` as a user starts it: the dashboard answers on 127.0.0.1 at the port asked for,
reads the database named, and stops on Ctrl-C."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from pipelinerl.platform.tracking.store import PlatformStore
from tests.conftest import worker_port

PORT = worker_port(27002)
TAKEN_PORT = worker_port(27004)


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as response:  # a first page on a loaded machine
        return json.loads(response.read())


def test_pipelinerl_ui_serves_the_database_it_is_given(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'platform.db'}"
    with PlatformStore(url) as store:
        store.create_run(
            "20261122-000000-pipeline-cli001", "cli", "pipeline", {}, datetime.now(UTC), mlflow_run_id="abc"
        )
    command = [sys.executable, "-m", "pipelinerl.cli", "ui", "--port", str(PORT), "--url", url]
    command += ["--mlflow-uri", f"sqlite:///{tmp_path / 'no-mlflow.db'}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                health = get_json(f"http://127.0.0.1:{PORT}/api/health")
                break
            except (urllib.error.URLError, ConnectionError):
                assert process.poll() is None, process.communicate()[0]
                assert time.monotonic() < deadline, "the dashboard did not answer within 90 s"
                time.sleep(0.5)
        assert health["database"]["ok"] is True
        runs = get_json(f"http://127.0.0.1:{PORT}/api/runs")
        assert [run["id"] for run in runs["runs"]] == ["20261122-000000-pipeline-cli001"]
        assert runs["warnings"] == [f"MLflow store 'sqlite:///{tmp_path / 'no-mlflow.db'}': no such file"]
        assert not (tmp_path / "no-mlflow.db").exists(), "the dashboard never creates a store"
    finally:
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=30)[0]
    assert process.returncode == 0, output
    assert f"dashboard: http://127.0.0.1:{PORT}" in output


def test_a_port_in_use_is_one_clear_error(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", TAKEN_PORT))
        holder.listen()
        command = [sys.executable, "-m", "pipelinerl.cli", "ui", "--port", str(TAKEN_PORT)]
        command += ["--url", f"sqlite:///{tmp_path / 'platform.db'}"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"port {TAKEN_PORT} on 127.0.0.1 is already in use" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
