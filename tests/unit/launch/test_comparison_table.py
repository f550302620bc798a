"""``pipelinerl compare`` in a terminal and in a log file: its result table at any width (every column
kept at 80 and 200 columns and in a file: one table, or a block per run), and its progress where a
spinner shows nothing."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

import pipelinerl.cli as cli
from pipelinerl.launch.compare import ComparisonResult, _stepped
from pipelinerl.launch.progress import print_comparison
from pipelinerl.platform.tracking.comparison import ModeRow


def result() -> ComparisonResult:
    def row(label: str, seconds: float, faster: float) -> ModeRow:
        return ModeRow(
            label, label, seconds, 96, {"conventional-G4": faster}, 0.987, 1.52, 4, 0.385, 0.912, 61.0
        )

    rows = [row("pipeline", 31.2, 1.77), row("conventional-G4", 55.4, 1.0)]
    return ComparisonResult("cmp-1", 0.615, rows, {}, None)


def printed(width: int, terminal: bool) -> str:
    out = io.StringIO()
    print_comparison(Console(file=out, width=width, force_terminal=terminal, color_system=None), result())
    return out.getvalue()


@pytest.mark.parametrize(("width", "terminal"), [(80, True), (200, True), (80, False)])
def test_every_column_and_value_is_printed_within_the_width(width: int, terminal: bool) -> None:
    text = printed(width, terminal)
    assert all(len(line) <= width for line in text.splitlines()), text
    flat = " ".join(text.split())
    for value in ("31 s", "55 s", "1.77", "0.987", "1.52 / 4", "38.5% -> 91.2%", "61 s", "96"):
        assert value in flat, (value, text)
    for heading in ("time to target", "samples to target", "ESS mean", "lag mean / max", "held-out success"):
        assert heading in flat, (heading, text)


def test_wide_enough_it_is_one_table_narrow_it_is_a_block_per_run() -> None:
    wide = printed(200, True)
    assert sum("ESS mean" in line for line in wide.splitlines()) == 1  # one header row
    narrow = printed(80, True)
    assert sum("ESS mean" in line for line in narrow.splitlines()) == 2  # a block per run


def test_written_to_a_file_a_comparison_says_each_phase_and_its_steps_now_and_then(monkeypatch) -> None:
    """A spinner shows nothing in a log file: each new phase is a timestamped line there, and a mode's
    steps at most every ``every_s`` seconds; in a terminal only the spinner's text changes."""
    out = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=out, width=80, force_terminal=False))
    spun: list[str] = []
    show = cli._status_lines(spun.append, every_s=3600)
    show("[1/2] pipeline")
    for version in (1, 2, 3):
        _stepped(show, "pipeline", 40, [{"policy_version": version, "rl/reward_mean": 0.25}])
    show("[pipeline] measuring held-out success of the final policy")
    lines = out.getvalue().splitlines()
    assert len(spun) == 5, "the spinner gets every update"
    assert [line[9:] for line in lines] == [
        "[1/2] pipeline",
        "[pipeline] step 1/40, train reward 0.250",  # a new phase; steps 2 and 3 within the hour
        "[pipeline] measuring held-out success of the final policy",
    ], lines
    terminal = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=terminal, width=80, force_terminal=True))
    cli._status_lines(spun.append)("[1/2] pipeline")
    assert terminal.getvalue() == ""
