"""Role heartbeats: written atomically, read back, aged; a damaged or missing file reads as none."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from pipelinerl.flows.role_heartbeat import (
    HEARTBEAT_INTERVAL_S,
    LATE_S,
    Heartbeat,
    attribution,
    beating,
    heartbeat_path,
    read_heartbeat,
    write_heartbeat,
)


def test_a_heartbeat_is_read_back_with_its_host_and_age(tmp_path: Path) -> None:
    path = heartbeat_path(tmp_path, "actor", 1)
    assert path == tmp_path / "roles" / "actor1.json"
    assert read_heartbeat(path) is None, "none written yet"
    before = time.time()
    write_heartbeat(path, "actor-1")
    beat = read_heartbeat(path)
    assert beat is not None and beat.host == "actor-1" and before <= beat.time <= time.time()
    assert beat.age_s(beat.time + 42.0) == 42.0
    assert beat.age_s(beat.time - 5.0) == 0.0, "a clock a little behind is not negative silence"
    assert list(path.parent.iterdir()) == [path], "no temporary file left behind"


def test_a_damaged_heartbeat_reads_as_none(tmp_path: Path) -> None:
    path = heartbeat_path(tmp_path, "trainer", 0)
    path.parent.mkdir(parents=True)
    for text in ("", "{", json.dumps({"host": "x"}), json.dumps([1, 2])):
        path.write_text(text)
        assert read_heartbeat(path) is None, text


def test_beating_writes_now_and_again_until_the_block_ends(tmp_path: Path) -> None:
    path = heartbeat_path(tmp_path, "actor", 0)
    with beating(path, interval_s=0.05) as host:
        assert host == socket.gethostname()
        first = read_heartbeat(path)
        assert isinstance(first, Heartbeat)
        deadline = time.monotonic() + 30
        while (beat := read_heartbeat(path)) is not None and beat.time == first.time:
            assert time.monotonic() < deadline, "no second beat"
            time.sleep(0.01)
    ended = read_heartbeat(path)
    assert ended is not None and ended.ended, "the last beat says the role's stages ended"
    time.sleep(0.2)
    assert read_heartbeat(path) == ended, "no beat after the block"


def test_a_block_that_fails_still_says_it_ended(tmp_path: Path) -> None:
    """A role whose stages failed stops beating while its flow run reports the failure (seconds, on a
    loaded machine): its last beat says so, so that silence is not taken for a lost host."""
    path = heartbeat_path(tmp_path, "trainer", 1)
    try:
        with beating(path, interval_s=0.05):
            beat = read_heartbeat(path)
            assert beat is not None and not beat.ended
            raise RuntimeError("a stage failed")
    except RuntimeError:
        pass
    beat = read_heartbeat(path)
    assert beat is not None and beat.ended


def test_a_heartbeat_written_before_ended_existed_reads_as_running(tmp_path: Path) -> None:
    path = heartbeat_path(tmp_path, "actor", 2)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"host": "h", "pid": 1, "time": 5.0}))
    assert read_heartbeat(path) == Heartbeat("h", 1, 5.0, ended=False)


def test_attribution_names_a_lapsed_heartbeat_and_watches_late_ones() -> None:
    """When a role fails, the other running roles' heartbeat ages say whether a lost host is behind it:
    a lapsed heartbeat names its role; a late one is watched; fresh ones and none-yet are neither."""
    timeout = 60.0
    fresh, late, lapsed = 3.0, LATE_S + 1.0, timeout + 1.0
    assert attribution({"actor0": fresh, "actor1": None}, timeout) == (None, [])
    assert attribution({"actor0": late, "actor1": fresh}, timeout) == (None, ["actor0"])
    assert attribution({"actor0": lapsed, "actor1": late}, timeout) == ("actor0", ["actor1"])
    assert attribution({"actor0": LATE_S, "actor1": timeout}, timeout) == (None, ["actor1"])
    # Two lapsed: the host lost first went silent first (the other may have stopped because of it).
    assert attribution({"trainer1": lapsed, "actor0": lapsed + 9.0}, timeout) == ("actor0", [])
    assert LATE_S > 2 * HEARTBEAT_INTERVAL_S  # a healthy role is never late: it beats every interval
