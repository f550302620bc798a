"""A run that stops making progress ends with an error naming the stall, never hours of silence.

The preprocessor is frozen (SIGSTOP) after the first optimizer step: every process stays alive, the
trainer waits for batches that never come, and the actors block on a full queue, which is what a
lost message or a peer that never answers looks like from the launcher. With
``run.stall_timeout_s=15`` the launcher gives up 15 s after the last new policy version, stops the
stages (SIGKILL reaches the frozen one) and raises ``RunStalled`` naming that version. The stages'
start-up, however slow on a loaded machine, has its own budget (``run.first_step_timeout_s``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from pipelinerl.launch.launcher import launch
from pipelinerl.launch.stages import RunStalled
from pipelinerl.platform.config import load_config
from tests.conftest import wait_until, worker_port

pytestmark = pytest.mark.slow


def _preprocessor_after_first_step(run_dir: Path) -> list[int]:
    """The preprocessor's pids once the run has trained its first version (else none)."""
    metrics = run_dir / "metrics.jsonl"
    if not (metrics.is_file() and metrics.read_text().strip()):
        return []
    pids = subprocess.run(
        ["pgrep", "-f", f"pipelinerl.workers.preprocessor --run-dir {run_dir}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    return [int(pid) for pid in pids]


def test_a_frozen_stage_ends_the_run_with_a_named_stall(tmp_path, random_model_dir):
    config = load_config(
        None,
        [
            f"model.path={random_model_dir}",
            f"run.output_dir={tmp_path}",
            f"run.home={tmp_path / 'home'}",
            "run.max_steps=50",
            "run.stall_timeout_s=15",
            # The first step, on a loaded 2-core machine, has the start-up budget.
            "run.first_step_timeout_s=300",
            "rl.group_size=4",
            "rl.batch_size=8",
            "actor.max_in_flight=8",
            "task.eval_problems=8",
            f"transport.base_port={worker_port(27800)}",
        ],
    )
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = launch(config, run_id="stalled")
        except BaseException as error:  # raised again below
            outcome["error"] = error

    def first_step_done() -> list[int]:
        if not thread.is_alive():
            pytest.fail(f"the run ended before its preprocessor could be frozen: {outcome}")
        return _preprocessor_after_first_step(tmp_path / "stalled")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    frozen: list[int] = []
    try:
        for pid in wait_until(first_step_done, timeout_s=300, what="the first step and the preprocessor"):
            os.kill(pid, signal.SIGSTOP)
            frozen.append(pid)
        thread.join(timeout=300)
        assert not thread.is_alive(), "the launcher never gave up on the stalled run"
    finally:
        for pid in frozen:  # normally gone already: the launcher's SIGKILL reaches a stopped process
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert frozen, "the preprocessor was frozen after the first step"
    with pytest.raises(RunStalled, match=r"no optimizer step for \d+ s since policy version \d+") as info:
        if "error" in outcome:
            raise outcome["error"]
    assert "run.stall_timeout_s=15" in str(info.value)
    records = [json.loads(line) for line in (tmp_path / "stalled" / "metrics.jsonl").read_text().splitlines()]
    assert 1 <= len(records) < config.run.max_steps
