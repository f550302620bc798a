"""``pipelinerl bench faults``: one config run undisturbed and run again under a flood of bad input.

For each seed the same experiment runs twice, undisturbed and then flooded. The flood begins once
the preprocessor has sent its first batch (the stages are up and warm) and lasts until the trainer
has taken ``FLOOD_UNTIL`` of the run's steps (so the run reads all of it before it ends), aimed at
the run's rollout socket, from a process holding the run's keys (every run authenticates its peers,
on loopback too, so the flood plays an insider whose keys leaked: what reaches the decoder and the
stage's checks); a process without them is refused at the handshake, which each flooded run checks once
(``keyless stranger``) and the preprocessor counts (``preprocessor/unauthenticated``):

* damaged, truncated, garbage and wrong-schema frames (``fault_frames.damaged_frames``) at ``rate``
  frames per second;
* at the start and then every ``IMPOSSIBLE_EVERY_S`` seconds, the run's own rollouts with tokens
  outside the vocabulary (complete groups: the preprocessor batches them, the trainer must refuse
  them), impossible values and groups that never complete (``fault_frames.impossible_rollouts``), in
  that order;
* at the start, ``OVERSIZED`` frames one byte over ``transport.max_message_mib``, on a connection of
  their own (ZeroMQ drops such a peer).

The first tick (the impossible set, the oversized frames, ``rate / 10`` damaged frames) goes out as
soon as the first batch is seen, before anything that can take time (the keyless handshake, finding
the preprocessor's process): a run of a few steps may otherwise end before the flood reaches it. The
preprocessor reads the stranger's connection in turn with the actor's (ZeroMQ's fair queueing), so
the set's out-of-vocabulary groups, first in line, are read within a batch of it and trained (refused)
while the run still has its steps ahead; behind the set's 300 others they could wait in the socket
past the run's last batch. Each run's row says how many it sent (``sent_outside_vocabulary``): the
trainer refuses at least the first set's and never more than were sent.

What each run wrote is the measurement: held-out success before and after (the summary), the
preprocessor's counts of refused, lost and dropped input (``preprocessor.final.json``, its counts when
it stopped), the trainer's refusals,
the ids of every trained rollout (none may be a stranger's), and the preprocessor's memory while the
flood lasts. The comparison of the two runs' learning is the point: bad input must cost nothing.
"Lost from the actors" is measured only where the preprocessor counted the actors' rollouts as theirs
(``preprocessor/received_from_actors``: their streams were pinned); otherwise it has no value and its
target is not met.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import zmq
from zmq.utils.monitor import recv_monitor_message

from pipelinerl.bench.fault_frames import damaged_frames, impossible_rollouts, numbered
from pipelinerl.launch.launcher import RunResult, launch
from pipelinerl.platform.config import PipelineConfig, with_overrides
from pipelinerl.platform.curve_keys import present_client_keys, run_keys
from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.tasks import build_task

IMPOSSIBLE_EVERY_S = 5.0
FLOOD_UNTIL = 0.75  # of the run's steps
OVERSIZED = 5
FIRST_BATCH_TIMEOUT_S = 600.0
KEYLESS_HANDSHAKE_TIMEOUT_S = 30.0  # a handshake takes milliseconds; a loaded machine gets ample room

TABLE_HEADERS = (
    "seed",
    "run",
    "held-out success",
    "gain",
    "damaged frames sent",
    "impossible rollouts sent",
    "refused and counted",
    "unread at the end",
    "lost from the actors",
    "keyless stranger",
    "stranger rollouts trained",
    "trainer refused",
    "preprocessor memory (MiB)",
    "steps",
)


@dataclass
class Flood:
    """What the flood sent, filled in by its thread."""

    damaged: int = 0
    impossible: int = 0
    outside_vocabulary: int = 0  # of ``impossible``: rollouts with token ids outside any vocabulary
    oversized: int = 0
    keyless: str | None = None  # how a peer without the run's keys fared: refused, accepted, no outcome
    rss_mib: list[float] = field(default_factory=list)
    error: str | None = None


def run_faults_bench(
    base: PipelineConfig,
    *,
    seeds: Sequence[int],
    rate: int,
    on_status: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Each seed's run undisturbed, then flooded; the report's headline, details and notes."""
    status = on_status or (lambda text: None)
    bench_id = f"{datetime.now():%Y%m%d-%H%M%S}-bench-faults-{uuid.uuid4().hex[:6]}"
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        config = with_overrides(base, {"run.seed": seed})
        status(f"[seed {seed}] undisturbed run")
        undisturbed = launch(config, run_id=f"{bench_id}-s{seed}-undisturbed", on_status=status)
        rows.append(run_row(seed, "undisturbed", undisturbed, Flood()))
        status(f"[seed {seed}] flooded run ({rate} damaged frames/s at the rollout socket)")
        flooded, flood = flooded_run(config, f"{bench_id}-s{seed}-flooded", rate, status)
        rows.append(run_row(seed, "flooded", flooded, flood))
    return summarize(rows, bench_id, base, rate)


def flooded_run(
    config: PipelineConfig, run_id: str, rate: int, status: Callable[[str], None]
) -> tuple[RunResult, Flood]:
    """``launch`` on a thread while this one floods the run's rollout socket until the run ends."""
    run_dir = (config.run.output_dir / run_id).resolve()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = launch(config, run_id=run_id, on_status=status)
        except BaseException as error:  # re-raised on the caller's thread
            outcome["error"] = error

    runner = threading.Thread(target=run, name="bench-faults-run")
    runner.start()
    flood = Flood()
    try:
        _flood(config, run_dir, rate, runner, flood)
    finally:
        runner.join()
    if "error" in outcome:
        raise outcome["error"]
    if flood.error is not None:
        raise RuntimeError(f"the flood of run {run_id} failed: {flood.error}")
    return outcome["result"], flood


def _wait_for_first_batch(run_dir: Path, runner: threading.Thread) -> bool:
    """Whether the preprocessor sent its first batch (False: the run ended, or failed, before it)."""
    records = run_dir / "preprocessor.jsonl"
    deadline = time.monotonic() + FIRST_BATCH_TIMEOUT_S
    while not (records.exists() and records.stat().st_size > 0):
        if not runner.is_alive():
            return False
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_dir.name}: no batch within {FIRST_BATCH_TIMEOUT_S:.0f} s")
        time.sleep(0.05)
    return True


def _flood(config: PipelineConfig, run_dir: Path, rate: int, runner: threading.Thread, flood: Flood) -> None:
    # Everything that takes time before the first batch: from it on, the run may have a few steps left.
    problems = build_task(config.task).problems("train", config.task.train_problems, config.run.seed)
    problem_ids = [problem.problem_id for problem in problems]
    address = config.transport.address("rollouts")
    context = zmq.Context()
    stranger = context.socket(zmq.PUSH)
    stranger.setsockopt(zmq.SNDTIMEO, 1000)  # a run that stopped reading does not hang the bench
    stranger.setsockopt(zmq.LINGER, 0)
    oversized = context.socket(zmq.PUSH)
    oversized.setsockopt(zmq.LINGER, 0)
    try:
        if not _wait_for_first_batch(run_dir, runner):
            return  # the run ended (or failed) before its first batch: nothing to flood
        keys = run_keys(run_dir)  # the launcher wrote them before any stage started
        present_client_keys(stranger, keys)
        present_client_keys(oversized, keys)
        stranger.connect(address)
        oversized.connect(address)
        for _ in range(OVERSIZED):
            oversized.send_multipart([b"x" * (config.transport.max_message_mib * 2**20 + 1)])
            flood.oversized += 1
        tick, chunk = 0.1, max(1, round(rate * 0.1))
        next_impossible, seq = 0.0, 0
        last_step = FLOOD_UNTIL * config.run.max_steps
        preprocessor = None
        while True:  # the first tick at once, even if the run has just ended; then until last_step
            started = time.monotonic()
            if started >= next_impossible:
                seq = _send_impossible(stranger, run_dir.name, problem_ids, seq, flood)
                next_impossible = started + IMPOSSIBLE_EVERY_S
            for _, frames in damaged_frames(chunk, seed=config.run.seed, first=flood.damaged):
                with contextlib.suppress(zmq.Again):
                    stranger.send_multipart(frames)
                    flood.damaged += 1
            if flood.keyless is None:  # once, the first tick's frames on their way
                preprocessor = _stage_process(run_dir, "pipelinerl.workers.preprocessor")
                flood.keyless = _keyless_handshake(context, address)
            if preprocessor is not None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    flood.rss_mib.append(preprocessor.memory_info().rss / 2**20)
            if not runner.is_alive() or _steps_trained(run_dir) >= last_step:
                break
            time.sleep(max(0.0, tick - (time.monotonic() - started)))
    except Exception as error:  # reported after the run ends; the run itself is never left running
        flood.error = f"{type(error).__name__}: {error}"
    finally:
        stranger.close(linger=0)
        oversized.close(linger=0)
        context.term()


def _send_impossible(stranger: Any, run_id: str, problem_ids: list[str], seq: int, flood: Flood) -> int:
    """One set of ``impossible_rollouts`` on the stranger's stream, its out-of-vocabulary groups first
    (the ones the preprocessor batches: first in line, they are read before the run's last batch); the
    stream's last number."""
    sets = impossible_rollouts(run_id, problem_ids, first=10**7 * seq)
    for kind in sorted(sets, key=lambda kind: kind != "outside_vocabulary"):
        for rollout in sets[kind]:
            seq += 1
            with contextlib.suppress(zmq.Again):
                stranger.send_multipart(numbered(rollout, seq, "impossible"))
                flood.impossible += 1
                flood.outside_vocabulary += kind == "outside_vocabulary"
    return seq


def _keyless_handshake(context: Any, address: str) -> str:
    """Connect a PUSH without the run's keys to ``address``; how its handshake ended, from its monitor."""
    failed = (
        zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        | zmq.EVENT_DISCONNECTED
    )
    socket = context.socket(zmq.PUSH)
    socket.setsockopt(zmq.LINGER, 0)
    monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | failed)
    try:
        socket.connect(address)
        deadline = time.monotonic() + KEYLESS_HANDSHAKE_TIMEOUT_S
        while (left := deadline - time.monotonic()) > 0 and monitor.poll(int(left * 1000)):
            event = recv_monitor_message(monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return "accepted"
            if event & failed:
                return "refused"
        return "no outcome"
    finally:
        socket.disable_monitor()
        monitor.close(linger=0)
        socket.close(linger=0)


def _steps_trained(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _stage_process(run_dir: Path, module: str) -> Any:
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if module in cmdline and str(run_dir) in " ".join(cmdline):
            return process
    return None


def run_row(seed: int, kind: str, run: RunResult, flood: Flood) -> dict[str, Any]:
    """One run's figures, read from what it wrote."""
    summary = run.summary
    final = run.run_dir / "preprocessor.final.json"
    last = json.loads(final.read_text()) if final.exists() else {}
    refused = int(last.get(registry.PREPROCESSOR_MALFORMED, 0) + last.get(registry.PREPROCESSOR_REJECTED, 0))
    trained = {rollout_id for record in run.records for rollout_id, _ in record.get(registry.ROLLOUTS, [])}
    return {
        "seed": seed,
        "run": kind,
        "run_id": run.run_dir.name,
        "success_start": summary.get("eval_success_start"),
        "success_end": summary.get("eval_success_end"),
        "gain": summary.get("eval_success_gain"),
        "reward_first": summary.get("reward_mean_first"),
        "reward_last": summary.get("reward_mean_last"),
        "ess_mean": summary.get("ess_mean"),
        "steps": summary.get("steps"),
        "final_policy_version": summary.get("final_policy_version"),
        "sent_damaged": flood.damaged,
        "sent_impossible": flood.impossible,
        "sent_outside_vocabulary": flood.outside_vocabulary,
        "sent_oversized": flood.oversized,
        "received": int(last.get(registry.PREPROCESSOR_RECEIVED, 0)),
        "refused": refused,
        # At most what the stranger sent and the stage never read: still queued when the run ended.
        "unread": max(0, flood.damaged + flood.impossible - refused),
        # The actors' messages lost; a stranger's damaged envelopes skip numbers of its own streams only.
        # Measured only if the actors' rollouts were counted as theirs (their streams pinned).
        "lost": _lost_from_actors(last),
        "received_from_actors": last.get(registry.PREPROCESSOR_RECEIVED_FROM_ACTORS),
        "keyless_stranger": flood.keyless,
        "unauthenticated": last.get(registry.PREPROCESSOR_UNAUTHENTICATED),
        "lost_any_stream": int(last.get(registry.PREPROCESSOR_LOST, 0)),
        "dropped_incomplete_groups": int(
            last.get(registry.name_of(registry.SAMPLES_DROPPED, reason="incomplete_group"), 0)
        ),
        "peer_disconnects": int(last.get(registry.PREPROCESSOR_PEER_DISCONNECTS, 0)),
        "trainer_refused": int(run.records[-1].get(registry.TRAINER_REJECTED, 0)) if run.records else 0,
        "stranger_trained": sum(rollout_id.startswith("stranger") for rollout_id in trained),
        "rss_mib": [round(min(flood.rss_mib), 1), round(max(flood.rss_mib), 1)] if flood.rss_mib else None,
    }


def _lost_from_actors(final: dict[str, Any]) -> int | None:
    """``preprocessor/lost_from_actors``, or None where it measured nothing: a record without it, or one
    whose actors' rollouts were never counted as theirs (their streams not pinned, so a loss in them
    would not have counted either)."""
    lost = final.get(registry.PREPROCESSOR_LOST_FROM_ACTORS)
    received = final.get(registry.PREPROCESSOR_RECEIVED_FROM_ACTORS)
    if lost is None or not received:
        return None
    return int(lost)


def _median(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def summarize(rows: list[dict[str, Any]], bench_id: str, base: PipelineConfig, rate: int) -> dict[str, Any]:
    flooded = [row for row in rows if row["run"] == "flooded"]
    undisturbed = {row["seed"]: row for row in rows if row["run"] == "undisturbed"}
    differences = [
        row["gain"] - undisturbed[row["seed"]]["gain"]
        for row in flooded
        if row["gain"] is not None and undisturbed[row["seed"]]["gain"] is not None
    ]
    growth = [row["rss_mib"][1] - row["rss_mib"][0] for row in flooded if row["rss_mib"]]
    headline = {
        "gain_undisturbed_median": _median([row["gain"] for row in undisturbed.values()]),
        "gain_flooded_median": _median([row["gain"] for row in flooded]),
        "gain_difference_median": _median(list(differences)),
        "gain_difference_range": [min(differences), max(differences)] if differences else None,
        "damaged_frames_sent": sum(row["sent_damaged"] for row in flooded),
        "impossible_rollouts_sent": sum(row["sent_impossible"] for row in flooded),
        "refused_counted": sum(row["refused"] for row in flooded),
        "unread_at_end": sum(row["unread"] for row in flooded),
        "lost": None if any(row["lost"] is None for row in rows) else sum(row["lost"] for row in rows),
        "keyless_strangers_refused": sum(row["keyless_stranger"] == "refused" for row in flooded),
        "flooded_runs": len(flooded),
        "stranger_rollouts_trained": sum(row["stranger_trained"] for row in rows),
        "preprocessor_growth_mib_max": max(growth) if growth else None,
        "runs_finished": sum(row["steps"] == base.run.max_steps for row in rows),
        "runs": len(rows),
    }
    notes = [
        "Both runs of a seed use the same config and seed; pipelined runs are not bit-reproducible "
        "(timing decides which policy version writes which token), so their gains differ by noise even "
        "undisturbed: compare the difference with the spread over seeds.",
        f"The flood aims at the rollout socket ({rate} damaged frames/s, impossible rollouts every "
        f"{IMPOSSIBLE_EVERY_S:.0f} s, {OVERSIZED} oversized frames at the start), from the first batch "
        f"until {FLOOD_UNTIL:.0%} of the steps are trained.",
        "Every run authenticates its peers (CurveZMQ, on loopback too): the flood is sent with the run's "
        "keys, as an insider whose keys leaked would; a peer without them (keyless stranger) is refused "
        "at the handshake and counted in preprocessor/unauthenticated.",
        "Refused counts every damaged frame and impossible rollout the preprocessor read, and also the "
        "actor's own rollouts of groups the incomplete-group bound dropped when they completed late.",
        "ZeroMQ's PULL reads its peers in turn, so the stranger's frames are read at most as often as the "
        "actor's rollouts while the preprocessor is busy: a flood faster than that waits in the socket "
        "buffers (unread at the end: sent minus refused, an upper bound) and cannot starve the actor.",
    ]
    return {
        "headline": headline,
        "details": {
            "rows": rows,
            "settings": {
                "bench_id": bench_id,
                "rate": rate,
                "max_steps": base.run.max_steps,
                "batch_size": base.rl.batch_size,
                "eval_problems": base.task.eval_problems,
                "max_message_mib": base.transport.max_message_mib,
            },
        },
        "notes": notes,
    }


def table_rows(record: dict[str, Any]) -> list[list[Any]]:
    """The markdown table's rows (``TABLE_HEADERS``), one per run."""
    rows = []
    for row in record["rows"]:
        flooded = row["run"] == "flooded"
        rows.append(
            [
                row["seed"],
                row["run"],
                f"{_percent(row['success_start'])} -> {_percent(row['success_end'])}",
                _percent(row["gain"]),
                row["sent_damaged"] if flooded else "",
                row["sent_impossible"] if flooded else "",
                row["refused"],
                row["unread"] if flooded else "",
                "-" if row["lost"] is None else row["lost"],
                row["keyless_stranger"] or "",
                row["stranger_trained"],
                row["trainer_refused"],
                "" if not row["rss_mib"] else f"{row['rss_mib'][0]:.0f} -> {row['rss_mib'][1]:.0f}",
                row["steps"],
            ]
        )
    return rows


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"
