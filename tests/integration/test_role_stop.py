"""A role asked to stop through the run directory (``flows/role_stop.py``) stops its stages at once:
what ``rl-role`` does when ``rl-run`` stops an attempt, whatever Prefect's event stream is doing. A real
actor stage process starts (it waits for a trainer that never comes), the request arrives, and
``run_role`` returns its reason with every process of the stage gone."""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from pipelinerl.flows.role_stop import request_stop, stop_request_path, stop_requested
from pipelinerl.launch.stages import run_role
from pipelinerl.platform.config import load_config
from pipelinerl.platform.curve_keys import create_curve_keys
from tests.conftest import worker_port


def test_a_stop_request_stops_the_role_s_stages_and_is_returned(
    tmp_path: Path, random_model_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    config = load_config(
        None,
        [
            f"model.path={random_model_dir}",
            f"run.output_dir={tmp_path}",
            f"transport.base_port={worker_port(24900)}",
        ],
    )
    (run_dir / "config.json").write_text(config.model_dump_json())
    create_curve_keys(run_dir)
    path = stop_request_path(run_dir, "0b7e5a52-0000-4000-8000-000000000001")
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # a test worker's own servers
    started: list[psutil.Process] = []

    def ask() -> str | None:
        if not started:  # the first turn: the stage processes have started
            started.extend(  # the run's stages (a stage server, shared by runs, is not one)
                p
                for p in psutil.Process().children(recursive=True)
                if p.pid not in before and str(run_dir) in " ".join(p.cmdline())
            )
            request_stop(path, "the run is stopping (attempt 1 failed)")
        return stop_requested(path)

    begun = time.monotonic()
    assert run_role(run_dir, "actor", 0, random_model_dir, stop_requested=ask) == (
        "the run is stopping (attempt 1 failed)"
    )
    print(f"stopped in {time.monotonic() - begun:.1f} s")
    assert started, "the actor stage process had started"
    assert not [p.pid for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_request_is_read_back_with_its_reason_and_none_before(tmp_path: Path) -> None:
    path = stop_request_path(tmp_path, "abc")
    assert path == tmp_path / "roles" / "stop" / "abc"
    assert stop_requested(path) is None
    request_stop(path, "the run is stopping")
    assert stop_requested(path) == "the run is stopping"
    assert list(path.parent.iterdir()) == [path], "no temporary file left behind"
