"""``pipelinerl bench restart``: the time from a trainer crash to the next optimizer step.

For each seed the same run is made twice, and trainer rank 0 is killed (SIGKILL) once it has trained
``kill_at`` versions and saved the checkpoint of the last: once with every stage restarted
(``run.actors_survive_restart=false``, as before) and once with the actors outliving the restart of
the trainer role (``platform/rebase.py``). Measured per run: seconds from the kill to the next step
any attempt trained (the first of the restarted stages), and what the restart record says (rollouts
lost in flight, sequences the actors kept, prompts handed out again). The comparison is the point: an
engine that takes long to start (vLLM: a minute on CPU, minutes for a large model on GPUs) is not
started again for a crash that was not its own.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from pipelinerl.launch.launcher import launch, new_run_id
from pipelinerl.platform.config import PipelineConfig, with_overrides
from pipelinerl.platform.restart_records import DISCARDED_DIR, read_restarts

TRAINER = "pipelinerl.workers.trainer"
POLL_S = 0.05
WAIT_S = 1800.0
MODES = {"restarted": False, "kept": True}  # row label -> run.actors_survive_restart
TABLE_HEADERS = [
    "seed",
    "actors",
    "kill -> next step (s)",
    "killed at version",
    "resumed from",
    "lost in flight",
    "kept in actors",
    "prompts handed out again",
]


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


def _trainer_pid(run_dir: Path) -> int | None:
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if TRAINER in cmdline and str(run_dir) in cmdline:
            return int(process.pid)
    return None


def _kill_trainer_at(run_dir: Path, version: int, done: Callable[[], bool]) -> float:
    """SIGKILL trainer rank 0 once its newest record is version ``version`` or later and a checkpoint's;
    returns when (time.time)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and not done():
        records = _lines(run_dir / "metrics.jsonl")
        if records and records[-1]["policy_version"] >= version and "checkpoint" in records[-1]:
            pid = _trainer_pid(run_dir)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                return time.time()
        time.sleep(POLL_S)
    raise RuntimeError(
        f"{run_dir.name}: the trainer never recorded a checkpoint at version {version} or later"
    )


def measure_run(config: PipelineConfig, kill_at: int, seed: int, keep_actors: bool) -> dict[str, Any]:
    """One run with one trainer kill; its row."""
    run_id = new_run_id(config.run.mode)
    run_dir = (config.run.output_dir / run_id).resolve()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = launch(config, run_id=run_id)
        except BaseException as error:  # reported below
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    killed = _kill_trainer_at(run_dir, kill_at, done=lambda: not thread.is_alive())
    thread.join()
    if "error" in outcome:
        raise RuntimeError(f"run {run_id} failed: {outcome['error']}")
    [restart] = read_restarts(run_dir)
    steps = _lines(run_dir / "metrics.jsonl")
    for aside in sorted((run_dir / DISCARDED_DIR).glob("attempt*/metrics.jsonl")):
        steps += _lines(aside)
    first_after = min(record["time"] for record in steps if record["time"] > killed)
    return {
        "seed": seed,
        "actors": "kept" if keep_actors else "restarted",
        "recovery_s": first_after - killed,
        "killed_at_version": max(r["policy_version"] for r in steps if r["time"] <= killed),
        "resumed_from": restart["resumed_from_version"],
        "lost_in_flight": restart["lost_in_flight"],
        "kept_in_actors": restart.get("kept_in_actors", 0),
        "regenerated": restart.get("regenerated", 0),
        "actors_restarted": restart.get("actors_restarted", True),
        "run_id": run_id,
    }


def run_restart_bench(
    base: PipelineConfig,
    *,
    seeds: Sequence[int],
    kill_at: int,
    on_status: Callable[[str], None] = lambda text: None,
) -> dict[str, Any]:
    rows = []
    for seed in seeds:
        for label, keep in MODES.items():
            config = with_overrides(
                base,
                {"run.seed": seed, "run.max_restarts": 1, "run.actors_survive_restart": keep},
            )
            on_status(f"seed {seed}: trainer killed at version {kill_at}, actors {label}")
            rows.append(measure_run(config, kill_at, seed, keep))
            on_status(f"seed {seed}, actors {label}: next step {rows[-1]['recovery_s']:.1f} s after the kill")
    medians = {
        label: statistics.median(row["recovery_s"] for row in rows if row["actors"] == label)
        for label in MODES
    }
    ratios = [
        restarted["recovery_s"] / kept["recovery_s"]
        for restarted, kept in zip(rows[::2], rows[1::2], strict=True)
    ]
    return {
        "headline": {
            "recovery_s_restarted_median": medians["restarted"],
            "recovery_s_kept_median": medians["kept"],
            "speedup_median": statistics.median(ratios),
            "speedup_min": min(ratios),
            "speedup_max": max(ratios),
            "runs": len(rows),
        },
        "notes": [
            "recovery: seconds from the SIGKILL of trainer rank 0 to the next optimizer step of any attempt",
            "kept: the actors outlived the restart (run.actors_survive_restart); restarted: every stage "
            "started again",
        ],
        "details": {
            "rows": rows,
            "settings": {
                "engine": base.actor.engine,
                "kill_at": kill_at,
                "checkpoint_every": base.trainer.checkpoint_every,
                "max_steps": base.run.max_steps,
            },
        },
    }


def table_rows(record: dict[str, Any]) -> list[list[str]]:
    return [
        [
            str(row["seed"]),
            row["actors"],
            f"{row['recovery_s']:.1f}",
            str(row["killed_at_version"]),
            str(row["resumed_from"]),
            str(row["lost_in_flight"]),
            str(row["kept_in_actors"]),
            str(row["regenerated"]),
        ]
        for row in record["rows"]
    ]
