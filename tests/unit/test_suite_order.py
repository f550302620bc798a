"""The suite's scheduling order (``tests/scheduling.py``) and the lock that keeps the multi-host run apart
(``tests/scheduling.py``): nothing lost, the alone files first, a writer not starved."""

from __future__ import annotations

import select
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tests.scheduling import ALONE_MARKER, LONGEST_FILES, MachineShare, suite_order

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Item:
    nodeid: str
    markers: set[str] = field(default_factory=set)

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


def test_every_listed_file_exists_once() -> None:
    assert len(set(LONGEST_FILES)) == len(LONGEST_FILES)
    missing = [path for path in LONGEST_FILES if not (ROOT / path).is_file()]
    assert not missing, f"LONGEST_FILES names files that are gone: {missing}"


def test_alone_files_then_the_rest_then_the_integration_files_longest_first() -> None:
    first, second = LONGEST_FILES[1], LONGEST_FILES[2]
    items = [
        Item("tests/unit/test_a.py::one"),
        Item(f"{second}::x"),
        Item("tests/integration/test_unlisted.py::u"),
        Item("tests/e2e/test_b.py::two"),
        Item(f"{first}::y"),
        Item("tests/integration/test_apart.py::alone", {ALONE_MARKER}),
        Item(f"{second}::z"),
        Item("tests/unit/test_a.py::three"),
    ]
    suite_order(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [
        "tests/integration/test_apart.py::alone",
        "tests/unit/test_a.py::one",
        "tests/e2e/test_b.py::two",
        "tests/unit/test_a.py::three",
        f"{first}::y",
        f"{second}::x",
        f"{second}::z",
        "tests/integration/test_unlisted.py::u",
    ]


HOLDER = """
import sys
from pathlib import Path
from tests.scheduling import MachineShare
share = MachineShare(Path(sys.argv[1]))
share.take("held", alone=sys.argv[2] == "alone")
print("taken", flush=True)
sys.stdin.readline()  # until told to give it back
share.give_back()
"""


def holder(directory: Path, kind: str) -> subprocess.Popen[str]:
    """Another test worker asking for the lock; it prints ``taken`` once it holds it."""
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory), kind],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def taken(process: subprocess.Popen[str]) -> None:
    """Returns once ``process`` holds the lock (it may first say how long it waited)."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip() == "taken":
            return
    raise AssertionError(f"the holder ended without the lock (exit code {process.wait()})")


def release(process: subprocess.Popen[str]) -> None:
    assert process.stdin is not None
    process.communicate("\n", timeout=60)  # closes the pipes
    assert process.returncode == 0


def waiting(process: subprocess.Popen[str], seconds: float) -> bool:
    """True if ``process`` has not printed ``taken`` within ``seconds``."""
    assert process.stdout is not None
    return select.select([process.stdout], [], [], seconds)[0] == []


def test_an_alone_module_waits_for_the_shared_ones_and_new_ones_wait_for_it(tmp_path: Path) -> None:
    """Another worker holds the lock shared; ours asks for it alone: it gets it only once the other
    gives it back, and a third worker's shared request made meanwhile waits behind ours (the gate),
    though the lock is only held shared then. (A slow machine can only make the waits look longer: the
    "still waiting" checks cannot fail by load.)"""
    reader = holder(tmp_path, "shared")
    taken(reader)
    ours = MachineShare(tmp_path)
    asking = threading.Thread(target=ours.take, args=("alone-module", True))
    asking.start()
    asking.join(1.0)
    assert asking.is_alive(), "the alone module waits while a shared module holds the lock"
    late = holder(tmp_path, "shared")
    assert waiting(late, 3.0), "a shared request waits at the gate while the alone module waits"
    release(reader)
    asking.join(60)
    assert not asking.is_alive(), "the alone module has the lock once the shared one gave it back"
    assert ours.module == "alone-module"
    assert waiting(late, 1.0), "the late shared request waits while the alone module holds the lock"
    ours.give_back()
    taken(late)
    release(late)
