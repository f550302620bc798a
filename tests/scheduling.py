"""How ``make test``'s two workers share the 2-core machine: the order they take the files in, and a
lock that gives the multi-host run the machine's whole runs to itself. Scheduling only: what a test
checks never depends on it.

**The order** (``suite_order``). xdist hands the workers whole files in collection order (``--dist
loadfile --no-loadscope-reorder``; its default order, most tests first, left the two-test vLLM run module
for last, and one worker ran it for 4 minutes while the other had finished):

1. the modules marked ``machine_alone`` (the multi-host run), so that one worker starts them at once;
2. the files outside tests/integration/ (unit and CLI tests, about two minutes), which the other worker
   runs meanwhile: they take no lock;
3. the integration files, the longest first (``LONGEST_FILES``, their seconds in a clean-clone run,
   docs/benchmarks.md "Test suite"), then the rest as collected: the short files at the end even out
   the two workers.

**The lock** (``MachineShare``). The multi-host module's one run (seven namespaces' services and
workers, two trainer ranks, two actors, the relays) took 160 s alone and over 900 s beside the vLLM
learning run on a slow machine, where its deadlines, made for a hang, ran out. So the workers take a
reader-writer lock around each integration module: integration modules hold it shared (two of them may
run at once), a ``machine_alone`` module exclusively (the other worker's integration modules wait for it;
unit tests go on beside it). A writer waits at a gate that new readers must pass, so the other worker's
stream of modules cannot starve it. The lock is taken around the test protocol, outside pytest-timeout's
clock: waiting for the other worker is not a test's time. Without xdist there is nothing to share.
"""

from __future__ import annotations

import fcntl
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import pytest

ALONE_MARKER = "machine_alone"
SHARED_UNDER = "tests/integration/"

LONGEST_FILES = (  # by their measured time in a clean run (tests/ durations, 2026-11-28), longest first
    "tests/integration/test_multihost.py",
    "tests/integration/test_vllm_pipeline.py",
    "tests/integration/test_pipeline.py",
    "tests/integration/test_stack.py",
    "tests/integration/test_vllm_engine.py",
    "tests/integration/test_bench_vllm.py",
    "tests/integration/test_tracking.py",
    "tests/integration/test_reward_hacking.py",
    "tests/integration/test_real_models.py",
    "tests/integration/test_bench_learning.py",
    "tests/integration/test_restart.py",
    "tests/integration/test_bench.py",
    "tests/integration/test_bench_faults.py",
    "tests/integration/test_ui.py",
    "tests/integration/test_recipes.py",
    "tests/integration/test_flows.py",
    "tests/integration/test_doctor.py",
    "tests/integration/test_stall.py",
    "tests/integration/test_hub_ids.py",
    "tests/integration/test_damaged_input.py",
)


def suite_order(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place (above): ``machine_alone`` files, then the files outside
    tests/integration/ as collected, then ``LONGEST_FILES`` in its order, then the other integration
    files as collected. Within a file the order stays."""
    longest = {path: index for index, path in enumerate(LONGEST_FILES)}

    def rank(item: pytest.Item) -> tuple[int, int]:
        share = share_of(item)
        if share == "alone":
            return (0, 0)
        if share is None:
            return (1, 0)
        return (2, longest.get(item.nodeid.split("::", 1)[0], len(longest)))

    items.sort(key=rank)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    suite_order(items)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{ALONE_MARKER}: the module's runs have the machine's whole runs to itself (tests/scheduling.py)",
    )


def share_of(item: pytest.Item) -> str | None:
    """``"alone"``, ``"shared"`` or None (the module takes no lock: unit tests and the like)."""
    if item.get_closest_marker(ALONE_MARKER) is not None:
        return "alone"
    return "shared" if item.nodeid.startswith(SHARED_UNDER) else None


def lock_directory(config: pytest.Config) -> Path | None:
    """Where this test run's workers meet: a directory named after xdist's run id; None without xdist."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is None:
        return None
    directory = Path(tempfile.gettempdir()) / f"pipelinerl-tests-{workerinput['testrunuid']}"
    directory.mkdir(exist_ok=True)
    return directory


class MachineShare:
    """One worker's hold on the lock: taken at a module's first test, given back after its last."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.module: str | None = None
        self.files: list[IO[str]] = []

    def take(self, module: str, alone: bool) -> None:
        gate = open(self.directory / "gate", "a+")  # noqa: SIM115 (held until give_back)
        lock = open(self.directory / "lock", "a+")  # noqa: SIM115
        started = time.monotonic()
        if alone:
            fcntl.flock(gate, fcntl.LOCK_EX)  # new readers stop here
            fcntl.flock(lock, fcntl.LOCK_EX)  # the readers already in finish their modules
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(lock, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        waited = time.monotonic() - started
        if waited > 1.0:
            print(f"\n{module}: waited {waited:.0f} s for the machine ({'alone' if alone else 'shared'})")
        self.module, self.files = module, [gate, lock]

    def give_back(self) -> None:
        for file in reversed(self.files):
            fcntl.flock(file, fcntl.LOCK_UN)
            file.close()
        self.module, self.files = None, []


_SHARE = pytest.StashKey[MachineShare]()


def _module(item: pytest.Item | None) -> str | None:
    return None if item is None else item.nodeid.split("::", 1)[0]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    directory = lock_directory(item.config)
    share = share_of(item)
    if directory is None or share is None:
        yield
        return
    held = item.config.stash.setdefault(_SHARE, MachineShare(directory))
    module = _module(item)
    if held.module != module:
        if held.module is not None:
            held.give_back()
        assert module is not None
        held.take(module, alone=share == "alone")
    try:
        yield
    finally:
        if _module(nextitem) != module:
            held.give_back()
