"""A run's launcher judged alive, gone or unknown from the identity it recorded."""

from __future__ import annotations

import subprocess
import sys

from pipelinerl.platform.tracking.liveness import judge, liveness_here, start_ticks, this_process

HERE = {"host": "node-a", "boot_id": "boot-1", "pid": 42, "start_ticks": 1000}


def started(ticks_by_pid):
    return lambda pid: ticks_by_pid.get(pid)


def test_a_local_process_with_the_same_start_is_alive_and_a_recycled_pid_is_not() -> None:
    assert judge(HERE, host="node-a", boot="boot-1", started=started({42: 1000})) == "alive"
    assert judge(HERE, host="node-a", boot="boot-1", started=started({42: 5555})) == "gone"  # pid reused
    assert judge(HERE, host="node-a", boot="boot-1", started=started({})) == "gone"


def test_another_host_another_boot_or_no_identity_cannot_be_judged_here() -> None:
    for host, boot in (("node-b", "boot-1"), ("node-a", "boot-2"), ("node-a", None)):
        assert judge(HERE, host=host, boot=boot, started=started({42: 1000})) == "unknown"
    assert judge(None, host="node-a", boot="boot-1", started=started({})) == "unknown"
    no_pid = {"host": "node-a", "boot_id": "boot-1"}
    assert judge(no_pid, host="node-a", boot="boot-1", started=started({})) == "unknown"


def test_real_processes() -> None:
    assert liveness_here(this_process()) == "alive"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        identity = {**this_process(), "pid": child.pid, "start_ticks": start_ticks(child.pid)}
        assert liveness_here(identity) == "alive"
    finally:
        child.kill()
        child.wait()
    assert liveness_here(identity) == "gone"
