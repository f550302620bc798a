"""``pipelinerl bench faults --quick`` for real: a run undisturbed and the same run flooded with
damaged and impossible input at its rollout socket; the record says what was sent, refused, lost and
trained (learning figures are meaningless at this size; no timing checks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import worker_port

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
def test_bench_faults_quick(tmp_path: Path, random_model_dir: Path):
    out = tmp_path / "faults.json"
    command = [
        str(Path(sys.executable).parent / "pipelinerl"),
        "bench",
        "faults",
        "--quick",
        "--rate",
        "2000",
        *("--set", f"model.path={random_model_dir}"),
        *("--set", f"run.output_dir={tmp_path / 'runs'}"),
        *("--set", f"run.home={tmp_path / 'home'}"),
        *("--set", "transport.max_message_mib=1"),
        *("--set", f"transport.base_port={worker_port(28100)}"),
        *("--out", str(out)),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=540, env=dict(os.environ))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["benchmark"] == "faults"
    rows = {row["run"]: row for row in record["rows"]}
    assert set(rows) == {"undisturbed", "flooded"}
    quiet, flooded = rows["undisturbed"], rows["flooded"]
    assert quiet["sent_damaged"] == 0 and quiet["refused"] == 0
    # The flood was sent while the run trained.
    # At least the first tick's (rate / 10 frames, the impossible set, the oversized frames): how many
    # more depends on how fast the run trains, which the test does not assume.
    assert flooded["sent_damaged"] >= 200, flooded
    assert flooded["sent_impossible"] >= 316 and flooded["sent_oversized"] == 5
    # What the stage read of it was refused and counted; what it had not read when the run ended is
    # reported (ZeroMQ reads the stranger and the actor in turn, so a flood cannot starve the actor).
    assert flooded["refused"] >= 1, flooded
    sent = flooded["sent_damaged"] + flooded["sent_impossible"]
    assert flooded["unread"] == max(0, sent - flooded["refused"])
    assert flooded["trainer_refused"] >= 16 or flooded["steps"] < 6
    # Nothing lost, no stranger's rollout trained, both runs finished all their steps. "Lost" can fail:
    # it is measured only where the actors' rollouts were counted as theirs (their streams pinned).
    assert record["lost"] == 0 and record["stranger_rollouts_trained"] == 0
    for row in (quiet, flooded):
        assert row["received_from_actors"] >= 6 * 16, row
    # The flood held the run's keys; a peer without them was refused at the handshake, and counted.
    assert flooded["keyless_stranger"] == "refused" and flooded["unauthenticated"] >= 1, flooded
    assert record["targets"]["keyless_strangers_refused"]["met"]
    assert quiet["steps"] == flooded["steps"] == 6
    assert record["runs_finished"] == record["runs"] == 2
    assert flooded["rss_mib"] is not None and flooded["rss_mib"][1] - flooded["rss_mib"][0] < 100
    assert record["targets"]["lost"]["met"] and record["targets"]["stranger_rollouts_trained"]["met"]
    for kind in ("undisturbed", "flooded"):  # both learning figures measured
        assert rows[kind]["success_start"] is not None and rows[kind]["success_end"] is not None
    assert "| 0 | flooded |" in done.stdout
