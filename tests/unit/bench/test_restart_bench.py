"""``pipelinerl bench restart``: its refusals, before any run starts, and its table."""

from __future__ import annotations

from typer.testing import CliRunner

from pipelinerl.bench.restart import TABLE_HEADERS, table_rows
from pipelinerl.cli import app


def test_a_kill_the_run_would_not_reach_is_refused_naming_the_values() -> None:
    result = CliRunner().invoke(app, ["bench", "restart", "--kill-at", "20", "--set", "run.max_steps=20"])
    assert result.exit_code == 2, result.output
    assert "--kill-at 20" in result.output and "run.max_steps=20" in result.output


def test_bad_seeds_are_refused() -> None:
    result = CliRunner().invoke(app, ["bench", "restart", "--seeds", "a,b"])
    assert result.exit_code == 2, result.output


def test_one_row_per_run_in_the_headers_order() -> None:
    row = {
        "seed": 1,
        "actors": "kept",
        "recovery_s": 14.73,
        "killed_at_version": 10,
        "resumed_from": 10,
        "lost_in_flight": 60,
        "kept_in_actors": 24,
        "regenerated": 30,
    }
    [cells] = table_rows({"rows": [row]})
    assert len(cells) == len(TABLE_HEADERS)
    assert cells == ["1", "kept", "14.7", "10", "10", "60", "24", "30"]
