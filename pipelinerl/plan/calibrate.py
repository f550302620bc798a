"""A cost profile fitted from finished runs: ``pipelinerl plan calibrate RUN_DIR...``.

What each figure is fitted from (the records every run writes, ``platform/tracking/metric_registry``):

* the trainer step: ``trainer/step_s`` of every step against its ``trainer/tokens`` (and
  ``trainer/samples`` when the runs differ in it; within one run every step trains B sequences, so a
  per-sequence cost cannot be told from the fixed one), least squares, no coefficient below 0;
* the transfer: the median ``weights/broadcast_ms``;
* the engine's pause for an update: the median ``weights/update_pause_ms`` of the actors' records;
* the decode step: each actor record gives ``actor/in_flight`` sequences writing
  ``throughput/actor_busy_tokens_per_s`` (per second of the time it was neither idle nor paused: the
  simulator adds those itself; older records: ``throughput/actor_tokens_per_s``), so one decode step of
  n sequences took ``n / tokens_per_s``; fitted
  against n (least squares, no coefficient below 0). The records carry no context lengths, so the
  per-context-token cost is folded into the others (0 here), and so is the prefill.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipelinerl.plan.costs import read_table
from pipelinerl.plan.fitting import nonnegative_fit
from pipelinerl.plan.lengths import EmpiricalLengths, Lengths, LogNormalLengths, parse_lengths
from pipelinerl.plan.profile import CostProfile, DecodeTable, Figure, Transfer
from pipelinerl.plan.transfer import MIB, LinkCosts, MeasuredUpdate, fit_link
from pipelinerl.platform.tracking import metric_registry as registry


class CalibrationError(ValueError):
    """Runs that do not hold what a figure is fitted from, naming the run and the figure."""


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def step_records(run: Path) -> list[dict[str, Any]]:
    """The run's trainer records of a step (``metrics.jsonl``)."""
    return [r for r in read_records(run / "metrics.jsonl") if registry.TRAINER_STEP_S in r]


def actor_records(run: Path) -> list[dict[str, Any]]:
    """Every actor's records of the run (``actor<k>.jsonl``)."""
    return [r for path in sorted(run.glob("actor*.jsonl")) for r in read_records(path)]


def decode_rate(record: dict[str, Any]) -> float:
    """The actor's tokens per second of decoding: of its busy time (neither idle nor paused for an
    update) where the record has it, else (runs before it was recorded) of all its time."""
    return float(record.get(registry.ACTOR_BUSY_TOKENS_PER_S, record.get(registry.ACTOR_TOKENS_PER_S, 0.0)))


def _rate_name(records: list[dict[str, Any]]) -> str:
    """Which rate the decode fit read, for the profile's sources."""
    busy = sum(registry.ACTOR_BUSY_TOKENS_PER_S in r for r in records)
    if busy == len(records):
        return registry.ACTOR_BUSY_TOKENS_PER_S
    older = f"{registry.ACTOR_TOKENS_PER_S}, idle time and pauses included"
    return (
        older
        if busy == 0
        else f"{registry.ACTOR_BUSY_TOKENS_PER_S}; {len(records) - busy} older records: {older}"
    )


def bench_record(path: Path, option: str, benchmark: str, holding: str) -> dict[str, Any]:
    """The ``pipelinerl bench <benchmark>`` record in ``path``, which holds ``holding``;
    ``CalibrationError`` naming the option, the file and what it is instead."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise CalibrationError(f"{option} {str(path)!r}: cannot be read as JSON ({error})") from None
    if not isinstance(record, dict) or record.get("benchmark") != benchmark or holding not in record:
        kind = record.get("benchmark") if isinstance(record, dict) else type(record).__name__
        raise CalibrationError(
            f"{option} {str(path)!r}: a `pipelinerl bench {benchmark}` record is needed (this is {kind!r})"
        )
    return record


def decode_table_from(engine_records: Sequence[Path]) -> DecodeTable:
    """The decode step against the sequences in flight, measured by ``pipelinerl bench decode`` records
    (the medians where several measured the same H); ``CalibrationError`` naming a file that is not such a
    record. A sweep at H held fewer than H on average (it refills whole groups and drains at the end);
    where the record says how many (``mean_in_flight``), the point is that many sequences and the step
    they took (mean_in_flight ÷ tokens/s), since the simulator refills and drains by itself; older
    records give H and H ÷ tokens/s."""
    by_in_flight: dict[int, list[tuple[float, float]]] = {}  # H -> (held, seconds) of each record
    for path in engine_records:
        record = bench_record(path, "--engine-record", "decode", "points")
        for point in record["points"]:
            if not point.get("step_s"):
                continue
            in_flight = int(point["in_flight"])
            held = float(point.get("mean_in_flight") or in_flight)
            step = float(point["step_s"]) * held / in_flight
            by_in_flight.setdefault(in_flight, []).append((held, step))
    # Several records of one H make one point (the medians), never near neighbours whose noise would
    # be read as a slope.
    points = sorted(
        (round(statistics.median(h for h, _ in measured), 2), statistics.median(s for _, s in measured))
        for measured in by_in_flight.values()
    )
    if len(points) < 2:
        shown = ", ".join(str(path) for path in engine_records)
        raise CalibrationError(
            f"--engine-record {shown}: {len(points)} value(s) of H measured; 2 or more needed"
        )
    values = ", ".join(f"{h:g} in flight: {1000 * step:.2f} ms" for h, step in points)
    names = ", ".join(Path(path).name for path in engine_records)
    return DecodeTable(points=points, source=f"pipelinerl bench decode records {names} ({values})")


def table_in_runs(table: DecodeTable, decoding: Sequence[dict[str, Any]], shown: str) -> DecodeTable:
    """``table`` (the engine alone) scaled to the runs' actors: an actor in a run writes slower than its
    engine alone (its other threads: the weights' receipt and checks, the rollouts' sending; the
    trainer's work beside it), so each record's decode step (in flight ÷ its busy rate) over the table's
    step at that many in flight, and the table times the median of those ratios."""
    points = tuple(table.points)
    ratios = [
        float(r[registry.ACTOR_IN_FLIGHT])
        / decode_rate(r)
        / read_table(points, float(r[registry.ACTOR_IN_FLIGHT]))
        for r in decoding
    ]
    factor = statistics.median(ratios)
    return DecodeTable(
        points=[(held, step * factor) for held, step in points],
        source=f"{table.source}; times {factor:.3f}, the median ratio of {len(ratios)} actor records of "
        f"{shown} (in flight ÷ {_rate_name(list(decoding))}) to the table at their in flight",
    )


def link_from(weights_records: Sequence[Path]) -> tuple[LinkCosts, str]:
    """The weight link's costs fitted from ``pipelinerl bench weights`` records (every bucket size they
    measured), and a description of where they come from; ``CalibrationError`` naming a file that is
    not such a record."""
    updates: list[MeasuredUpdate] = []
    for path in weights_records:
        record = bench_record(path, "--weights-record", "weights", "bucket_sizes")
        rows = record["bucket_sizes"]
        update_bytes = int(float(record["model_mib"]) * MIB)
        updates += [
            MeasuredUpdate(
                update_bytes, int(row["buckets_per_update"]), float(row["update_ms_median"]) / 1000
            )
            for row in rows
        ]
    try:
        link = fit_link(updates)
    except ValueError as error:
        raise CalibrationError(f"--weights-record {', '.join(map(str, weights_records))}: {error}") from None
    names = ", ".join(Path(path).name for path in weights_records)
    return link, f"fitted on {len(updates)} bucket sizes of pipelinerl bench weights records {names}"


def update_bytes_of(run: Path) -> int:
    """The bytes of one weight update of ``run``'s model: its final checkpoint's weights."""
    files = sorted((run / "final").glob("*.safetensors"))
    if not files:
        raise CalibrationError(f"{run}: no final/*.safetensors, so the bytes of an update are not known")
    return sum(path.stat().st_size for path in files)


def fit_trainer_steps(steps: Sequence[dict[str, Any]]) -> tuple[float, float, float, float]:
    """The trainer step's fixed, per-token and per-sequence costs (least squares of ``trainer/step_s``
    on the step's tokens, and its sequences where the steps differ in them; none below 0) and the
    steps' spread around the fit (the standard deviation of log(step / fitted))."""
    tokens = [float(r[registry.TRAINER_TOKENS]) for r in steps]
    samples = [float(r[registry.TRAINER_SAMPLES]) for r in steps]
    step_s = [float(r[registry.TRAINER_STEP_S]) for r in steps]
    ones = [1.0] * len(steps)
    if len(set(samples)) > 1:
        base, per_token, per_sequence = nonnegative_fit([ones, tokens, samples], step_s)
    else:
        (base, per_token), per_sequence = nonnegative_fit([ones, tokens], step_s), 0.0
    fitted = [base + per_token * t + per_sequence * n for t, n in zip(tokens, samples, strict=True)]
    log_ratios = [math.log(s / f) for s, f in zip(step_s, fitted, strict=True) if s > 0 and f > 0]
    return base, per_token, per_sequence, statistics.pstdev(log_ratios) if len(log_ratios) > 1 else 0.0


def calibrate(
    run_dirs: Iterable[Path],
    name: str,
    engine_records: Sequence[Path] = (),
    weights_records: Sequence[Path] = (),
    scale_table_to_runs: bool = False,
) -> CostProfile:
    """The profile fitted from ``run_dirs``' records (and the decode step from ``engine_records``, ``bench
    decode`` records, the weight link from ``weights_records``, ``bench weights`` records, when given);
    ``CalibrationError`` naming what is missing. With a decode table and runs whose actors recorded
    their rate with sequences in flight, ``scale_table_to_runs`` scales the table to what those actors
    wrote (``table_in_runs``)."""
    table = decode_table_from(engine_records) if engine_records else None
    runs = [Path(run_dir) for run_dir in run_dirs]
    if not runs:
        raise CalibrationError("give at least one run directory")
    steps: list[dict[str, Any]] = []
    actors: list[dict[str, Any]] = []
    for run in runs:
        if not (run / "metrics.jsonl").exists():
            raise CalibrationError(f"{run}: no metrics.jsonl (not a run directory, or no step was trained)")
        steps += step_records(run)
        actors += actor_records(run)
    shown = ", ".join(run.name for run in runs)
    if len(steps) < 2:
        raise CalibrationError(f"{shown}: {len(steps)} trainer steps recorded; the fit needs 2 or more")
    decoding = [r for r in actors if r.get(registry.ACTOR_IN_FLIGHT, 0) > 0 and decode_rate(r) > 0]
    if not decoding and table is None:
        raise CalibrationError(
            f"{shown}: no actor record with sequences in flight and a token rate (a conventional or async "
            "run's are taken between rounds or drains); add a run in pipeline mode, or --engine-record"
        )

    base, per_token, per_sequence, step_log_sd = fit_trainer_steps(steps)
    samples = [float(r[registry.TRAINER_SAMPLES]) for r in steps]
    if table is not None and decoding and scale_table_to_runs:
        table = table_in_runs(table, decoding, shown)
    if table is not None:  # the linear form's figures from the table, which the simulator reads instead
        in_flight = [float(h) for h, _ in table.points]
        decode_s = [step for _, step in table.points]
    else:
        in_flight = [float(r[registry.ACTOR_IN_FLIGHT]) for r in decoding]
        decode_s = [n / decode_rate(r) for n, r in zip(in_flight, decoding, strict=True)]
    decode_base, decode_per_sequence = nonnegative_fit([[1.0] * len(decode_s), in_flight], decode_s)
    broadcasts = [
        float(r[registry.WEIGHTS_BROADCAST_MS]) / 1000 for r in steps if registry.WEIGHTS_BROADCAST_MS in r
    ]
    pauses = [float(r[registry.UPDATE_PAUSE_MS]) / 1000 for r in actors if registry.UPDATE_PAUSE_MS in r]

    step_source = f"fitted on {len(steps)} trainer steps of {shown} (trainer/step_s against trainer/tokens)"
    decode_source = (
        f"fitted on {len(decoding)} actor records of {shown} "
        f"(actor/in_flight / {_rate_name(decoding)} against actor/in_flight)"
        if table is None
        else "a straight line through the decode table's points (the simulator reads the table itself)"
    )
    folded = f"not in the records of {shown}: folded into the decode fit"
    figures = {
        "decode_base_s": Figure(value=decode_base, unit="s", source=decode_source),
        "decode_per_sequence_s": Figure(value=decode_per_sequence, unit="s/sequence", source=decode_source),
        "decode_per_context_token_s": Figure(value=0.0, unit="s/token", source=folded),
        "prefill_per_token_s": Figure(value=0.0, unit="s/token", source=folded),
        "train_base_s": Figure(value=base, unit="s", source=step_source),
        "train_per_token_s": Figure(value=per_token, unit="s/token", source=step_source),
        "train_per_sequence_s": Figure(
            value=per_sequence,
            unit="s/sequence",
            source=step_source if len(set(samples)) > 1 else f"every step of {shown} trained B sequences: 0",
        ),
        "train_step_log_sd": Figure(
            value=step_log_sd,
            unit="sd of log(step / fitted step)",
            source=f"the spread of the {len(steps)} steps of {shown} around the fitted step time",
        ),
        "transfer_s": Figure(
            value=statistics.median(broadcasts) if broadcasts else 0.0,
            unit="s",
            source=f"median weights/broadcast_ms of {len(broadcasts)} updates of {shown}",
        ),
        "update_pause_s": Figure(
            value=statistics.median(pauses) if pauses else 0.0,
            unit="s",
            source=f"median weights/update_pause_ms of {len(pauses)} actor updates of {shown}",
        ),
    }
    transfer = None
    if weights_records:
        link, link_source = link_from(weights_records)
        update_bytes = update_bytes_of(runs[0])
        config = json.loads((runs[0] / "config.json").read_text())
        bucket_bytes = int(config["transport"]["weight_bucket_mib"]) * MIB
        # The runs' own transfers beyond what the link's bytes and buckets explain: the notice and
        # hand-over, a fixed cost (0 if the link alone is slower than the runs were).
        fixed = max(0.0, figures["transfer_s"].value - link.seconds(update_bytes, bucket_bytes))
        transfer = Transfer(
            link="the weight group's link as pipelinerl bench weights measured it",
            bytes_per_s=link.bytes_per_s,
            per_bucket_s=link.per_bucket_s,
            fixed_s=fixed,
            update_bytes=update_bytes,
            source=f"{link_source}; the update's bytes from {runs[0].name}/final; the fixed cost what is "
            f"left of the runs' median transfer in their {bucket_bytes // MIB} MiB buckets",
        )
    profile = CostProfile(
        name=name,
        description=f"calibrated from {shown}",
        figures=figures,
        decode_table=table,
        transfer=transfer,
        lengths=lengths_of_runs(runs),
    )
    try:
        profile.cost_model()
    except ValueError as error:
        raise CalibrationError(f"{shown}: the fitted figures are unusable ({error})") from None
    return profile


def lengths_of_runs(run_dirs: Iterable[Path]) -> str | None:
    """The runs' completions as a form a profile carries (a lognormal of their mean and 90th percentile;
    a log-logistic where the tail is too heavy for one), or None when the runs kept no per-token files."""
    try:
        observed = np.asarray(completion_lengths(run_dirs).observed, dtype=np.float64)
    except CalibrationError:
        return None
    mean, median, p90 = (float(value) for value in (observed.mean(), *np.percentile(observed, [50, 90])))
    if p90 <= mean:  # (nearly) one length
        return f"fixed:{round(mean)}"
    try:
        LogNormalLengths.from_mean_p90(mean, p90, max_tokens=2**31)
    except ValueError:  # a tail too heavy for a lognormal: the log-logistic's median and p90
        return f"loglogistic:{median:.1f},{p90:.1f}" if median < p90 else f"fixed:{round(mean)}"
    return f"lognormal:{mean:.1f},{p90:.1f}"


def completion_lengths(run_dirs: Iterable[Path]) -> EmpiricalLengths:
    """The lengths of every completion the runs trained, from their per-token files
    (``tokens/step_*_rank*.npz``: a completion's tokens are consecutive, its first at position 0)."""
    lengths: list[int] = []
    runs = [Path(run_dir) for run_dir in run_dirs]
    for run in runs:
        for path in sorted(run.glob("tokens/step_*_rank*.npz")):
            with np.load(path) as tokens:
                positions = tokens["token_positions"]
            starts = np.flatnonzero(positions == 0)
            lengths += np.diff(np.append(starts, len(positions))).tolist()
    if not lengths:
        raise CalibrationError(
            f"{', '.join(str(run) for run in runs)}: no per-token files (tokens/step_*.npz)"
        )
    return EmpiricalLengths(lengths)


def lengths_from(text: str, max_new_tokens: int) -> Lengths:
    """Completion lengths as a user gives them: ``run:RUN_DIR[,RUN_DIR...]`` (the completions those
    finished runs trained) or a form of ``parse_lengths``, cut at ``max_new_tokens``."""
    if text.startswith("run:"):
        return completion_lengths([Path(part) for part in text[4:].split(",")])
    return parse_lengths(text, max_new_tokens)
