"""``pipelinerl db …`` and ``pipelinerl runs …`` as a user runs them, on a SQLite file."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pipelinerl.platform.tracking.db import ENV_DATABASE_URL
from pipelinerl.platform.tracking.store import PlatformStore

PIPELINERL = [sys.executable, "-m", "pipelinerl.cli"]
RUN_ID = "20261122-043000-pipeline-ab12"


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # At the default 80 columns of a pipe: tables must still print whole rows.
    env = {key: value for key, value in os.environ.items() if key not in (ENV_DATABASE_URL, "COLUMNS")}
    return subprocess.run([*PIPELINERL, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'platform.db'}"


def record_a_run(url: str) -> None:
    started = datetime(2026, 11, 22, 4, 30, tzinfo=UTC)
    with PlatformStore(url) as store:
        store.create_run(RUN_ID, "pipelinerl", "pipeline", {"run": {"mode": "pipeline"}}, started)
        store.set_mlflow_run_id(RUN_ID, "0f1e2d3c4b5a")
        for version, reward in ((1, 0.125), (2, 0.25)):
            store.record_step(
                RUN_ID,
                version,
                {"rl/reward_mean": reward, "rl/ess": 0.875, "lag/mean": 0.5, "lag/p90": 1.0, "lag/max": 2,
                 "trainer/samples": 32},
                {0: 10, 1: 5, 2: 1},
            )  # fmt: skip
            store.record_policy_version(RUN_ID, version, 32 * version, 900 * version, started)
        store.finish_run(
            RUN_ID, "finished", started + timedelta(minutes=2, seconds=5), {"eval_success_end": 0.4375}
        )


def test_upgrade_current_downgrade(url: str) -> None:
    result = run_cli("db", "current", "--url", url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "not migrated" in result.stdout

    result = run_cli("db", "upgrade", "--url", url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "at revision 0004" in result.stdout

    result = run_cli("db", "current", "--url", url)
    assert result.returncode == 0 and "revision 0004 (head)" in result.stdout

    result = run_cli("db", "downgrade", "--url", url, "--revision", "base")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "base (no platform tables)" in result.stdout
    assert "not migrated" in run_cli("db", "current", "--url", url).stdout


def test_runs_list_and_show(url: str) -> None:
    result = run_cli("runs", "list", "--url", url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no runs recorded yet" in result.stdout

    record_a_run(url)
    result = run_cli("runs", "list", "--url", url)
    assert result.returncode == 0, result.stdout + result.stderr
    (row,) = [line for line in result.stdout.splitlines() if RUN_ID in line]
    for cell in ("pipelinerl", "pipeline", "finished", "2m 05s", "0.438", "0f1e2d3c4b5a"):
        assert cell in row, (cell, row)

    result = run_cli("runs", "show", "20261122-0430", "--url", url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"run {RUN_ID}" in result.stdout and "summary.eval_success_end" in result.stdout
    step_rows = [line.split("│")[1:-1] for line in result.stdout.splitlines() if line.count("│") == 8]
    cells = [[cell.strip() for cell in row] for row in step_rows]
    assert ["1", "0.125", "0.875", "0.50", "1.0", "2", "32"] in cells
    assert ["2", "0.250", "0.875", "0.50", "1.0", "2", "32"] in cells


def test_unknown_run_and_bad_urls_fail_in_one_line(url: str) -> None:
    record_a_run(url)
    result = run_cli("runs", "show", "nosuch", "--url", url)
    assert result.returncode == 2
    assert result.stdout.strip() == "error: no run 'nosuch' in the platform database", (
        result.stdout + result.stderr
    )

    for bad, expected in (
        ("mysql://user@host/db", "unsupported database backend 'mysql'"),
        ("postgresql://postgres@127.0.0.1:1/platform", "cannot use the platform database"),
    ):
        result = run_cli("db", "current", "--url", bad)
        assert result.returncode == 2, result.stdout + result.stderr
        assert expected in result.stdout and "Traceback" not in result.stdout + result.stderr
        assert len(result.stdout.strip().splitlines()) == 1, result.stdout


def test_url_defaults_to_the_configured_platform_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = run_cli("db", "upgrade", "--set", f"run.home={home}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (home / "platform.db").is_file()
    result = run_cli("runs", "list", "--set", "run.home=[1]")
    assert result.returncode == 2 and "run.home" in result.stdout


def test_help_does_not_import_the_database_libraries() -> None:
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, pipelinerl.cli; print('sqlalchemy' in sys.modules, 'alembic' in sys.modules)",
        ],
        capture_output=True,
        text=True,
    )
    assert probe.stdout.strip() == "False False", probe.stderr
    result = run_cli("--help")
    assert result.returncode == 0 and "db" in result.stdout and "runs" in result.stdout


def test_a_comparison_parent_shows_its_runs_and_a_readable_summary(url: str) -> None:
    """``runs show`` of a compare parent: its runs under it, its summary flattened with floats to 4
    digits (not a Python dict of 16-digit floats), no "steps 0"."""
    started = datetime(2026, 11, 22, 5, 0, tzinfo=UTC)
    with PlatformStore(url) as store:
        store.create_run("cmp-7", "pipelinerl", "compare", {}, started)
        for index, mode in enumerate(("pipeline", "conventional")):
            child = f"cmp-7-{mode}"
            store.create_run(
                child, "pipelinerl", mode, {}, started + timedelta(minutes=index), parent_run_id="cmp-7"
            )
            store.finish_run(
                child, "finished", started + timedelta(minutes=index + 1), {"eval_success_end": 0.4375}
            )
        summary = {"target": 0.6153846153846154, "rows": [{"label": "pipeline", "ess_mean": 0.98765432101}]}
        store.finish_run("cmp-7", "finished", started + timedelta(minutes=3), summary)
    result = run_cli("runs", "show", "cmp-7", "--url", url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "summary.target" in result.stdout and "0.6154" in result.stdout
    assert "summary.rows.0.ess_mean" in result.stdout and "0.9877" in result.stdout
    assert "0.6153846153846154" not in result.stdout and "{" not in result.stdout
    assert "runs under it" in result.stdout
    assert "cmp-7-pipeline" in result.stdout and "cmp-7-conventional" in result.stdout
    assert "43.8%" in result.stdout and "its 2 runs train" in result.stdout
