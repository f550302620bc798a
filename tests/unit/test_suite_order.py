"""The suite's scheduling order (``tests/conftest.py``): the longest files first, nothing lost."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.conftest import LONGEST_FILES, longest_first

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Item:
    nodeid: str


def test_every_listed_file_exists_once() -> None:
    assert len(set(LONGEST_FILES)) == len(LONGEST_FILES)
    missing = [path for path in LONGEST_FILES if not (ROOT / path).is_file()]
    assert not missing, f"LONGEST_FILES names files that are gone: {missing}"


def test_the_listed_files_come_first_in_their_order_and_each_file_keeps_its_own() -> None:
    first, second = LONGEST_FILES[0], LONGEST_FILES[1]
    items = [
        Item("tests/unit/test_a.py::one"),
        Item(f"{second}::x"),
        Item("tests/e2e/test_b.py::two"),
        Item(f"{first}::y"),
        Item(f"{second}::z"),
        Item("tests/unit/test_a.py::three"),
    ]
    longest_first(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [
        f"{first}::y",
        f"{second}::x",
        f"{second}::z",
        "tests/unit/test_a.py::one",
        "tests/e2e/test_b.py::two",
        "tests/unit/test_a.py::three",
    ]
