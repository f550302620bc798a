"""``pipelinerl compare``'s result table at any width: every column kept, at 80 and 200 columns and in a
file (the cells wrap, or each run becomes a block of its own), never a column dropped or cut."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from pipelinerl.launch.compare import ComparisonResult
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
