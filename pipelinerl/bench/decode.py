"""``pipelinerl bench decode``: an engine's decode step against the sequences it holds in flight.

For each H of a sweep the engine generates the embedded task's prompts, G samples each, refilling
whole groups as the actor does, with up to H in flight (``engine_measure.run_continuous``); a decode
step writes a token of every sequence held, so with ``mean_in_flight`` held on average (below H: the
refills wait for a whole group's room, and the last wave drains) a step takes mean_in_flight ÷ tokens/s
(the median of the repeats; ``step_s`` is H ÷ tokens/s, as older records give it). The record's
``points`` are what ``pipelinerl plan calibrate --engine-record`` turns into the simulator's decode-step
table (``plan/costs.py``), at the sequences held: measured, not assumed linear in them. On a CPU, give
the engine the core the run's actor has (``--cpus``): the figure is the engine's alone.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelinerl.bench.engine_workload import EngineBenchSettings, build_workload

DEFAULT_IN_FLIGHT = (4, 8, 16, 24, 32, 48, 64)


@dataclass(frozen=True)
class DecodeSweepSettings:
    in_flight: tuple[int, ...] = DEFAULT_IN_FLIGHT
    waves: int = 8  # each H generates this many times H sequences: the drain at the end is a small part
    group_size: int = 4
    max_new_tokens: int = 96  # actor.max_new_tokens's default
    temperature: float = 1.0
    repeats: int = 3
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        if (
            not self.in_flight
            or any(h < 1 for h in self.in_flight)
            or len(set(self.in_flight)) < len(self.in_flight)
        ):
            raise ValueError(f"in_flight={list(self.in_flight)}: give distinct values of H, each 1 or more")

    @classmethod
    def quick(cls, **overrides: Any) -> DecodeSweepSettings:
        """Small sizes that prove the sweep works in seconds (numbers not meaningful)."""
        return cls(**{"in_flight": (4, 8), "waves": 2, "max_new_tokens": 16, "repeats": 1, **overrides})

    def engine_settings(self, in_flight: int) -> EngineBenchSettings:
        prompts = max(1, self.waves * max(in_flight, self.group_size) // self.group_size)
        return EngineBenchSettings(
            in_flight=in_flight,
            num_prompts=prompts,
            group_size=self.group_size,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            repeats=self.repeats,
            seed=self.seed,
            threads=self.threads,
        )


def run_decode_sweep(
    model_path: Path, settings: DecodeSweepSettings, progress: Any = None
) -> list[dict[str, Any]]:
    """One point per H: tokens/s (median of the repeats, and each), sequences, the decode step."""
    import torch  # noqa: PLC0415 (the CLI's help must not wait for torch)
    from transformers import AutoTokenizer  # noqa: PLC0415

    from pipelinerl.bench.engine_factories import ENGINES  # noqa: PLC0415
    from pipelinerl.bench.engine_measure import run_continuous  # noqa: PLC0415

    torch.set_num_threads(settings.threads)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    task = progress.add_task("decode sweep", total=len(settings.in_flight)) if progress is not None else None
    points = []
    for in_flight in settings.in_flight:
        engine_settings = settings.engine_settings(in_flight)
        workload = build_workload(tokenizer, engine_settings)
        engine, _ = ENGINES["transformers"](model_path, workload, engine_settings)
        try:
            warmup = replace(workload, prompts=workload.prompts[: max(in_flight, settings.group_size)])
            run_continuous(engine, warmup, in_flight)  # lazy initialisation is not throughput
            runs = [run_continuous(engine, workload, in_flight) for _ in range(settings.repeats)]
        finally:
            engine.close()
        rates = [run.useful_tokens_per_s for run in runs]
        median = statistics.median(rates)
        points.append(
            {
                "in_flight": in_flight,
                "tokens_per_s": median,
                "tokens_per_s_runs": rates,
                "step_s": in_flight / median if median else None,
                "sequences": workload.num_sequences,
                "tokens_per_sequence": statistics.median(run.useful_tokens / run.sequences for run in runs),
                # The engine held fewer than H on average (refills in whole groups, the drain at the end):
                # a decode step of that many takes mean_in_flight / tokens/s.
                "mean_in_flight": statistics.median(run.mean_in_flight for run in runs),
            }
        )
        if task is not None:
            progress.advance(task)
    return points


def summarize(points: list[dict[str, Any]], settings: DecodeSweepSettings) -> dict[str, Any]:
    return {
        "headline": {"points": points},
        "details": {"workload": asdict(settings)},
        "notes": [
            "step_s = H / tokens/s: a decode step of H sequences writes H tokens (prefill and the drain at "
            "the end of each measurement included, as in the actor's records).",
            "plan calibrate --engine-record reads points: the simulator's decode step at H, interpolated "
            "between the measured values of H (plan/costs.py).",
        ],
    }


def render(record: dict[str, Any]) -> str:
    lines = [
        "| H | held on average | tokens/s | decode step of H (ms) | of those held (ms) | tokens a sequence |",
        "|---|---|---|---|---|---|",
    ]
    for point in record["points"]:
        step, held = point["step_s"], point.get("mean_in_flight")
        if step is None:
            lines.append(f"| {point['in_flight']} | — | 0 | — | — | — |")
            continue
        of_held = f"{1000 * held / point['tokens_per_s']:.2f}" if held else "—"
        lines.append(
            f"| {point['in_flight']} | {f'{held:.1f}' if held else '—'} | {point['tokens_per_s']:,.0f} | "
            f"{1000 * step:.2f} | {of_held} | {point['tokens_per_sequence']:.1f} |"
        )
    return "\n".join(lines)


def decode_command(
    in_flight: str,
    max_new_tokens: int,
    repeats: int,
    cpus: str | None,
    model_path: Path | None,
    quick: bool,
    threads: int,
    seed: int,
    out: Path | None,
) -> None:
    """``pipelinerl bench decode``'s work: its options checked (exit 2 naming the bad one), the process
    confined to ``cpus``, the sweep, the record and its table."""
    from pipelinerl.bench.cli_support import fail, finish, model_path_or_default, progress_display  # noqa: PLC0415
    from pipelinerl.bench.report import load_average  # noqa: PLC0415

    try:
        values = tuple(int(part) for part in in_flight.split(",") if part.strip())
        cores = sorted({int(part) for part in cpus.split(",") if part.strip()}) if cpus else []
        settings = (
            DecodeSweepSettings.quick(seed=seed, threads=threads)
            if quick
            else DecodeSweepSettings(
                in_flight=values, max_new_tokens=max_new_tokens, repeats=repeats, seed=seed, threads=threads
            )
        )
    except ValueError as error:
        raise fail(f"--in-flight {in_flight!r} / --cpus {cpus!r}: {error}") from None
    available = os.sched_getaffinity(0)
    if missing := sorted(set(cores) - available):
        raise fail(f"--cpus {cpus!r}: core(s) {missing} are not available here; valid: {sorted(available)}")
    if cores:
        os.sched_setaffinity(0, cores)
    load_before, started_at = load_average(), datetime.now(UTC)
    path = model_path_or_default(model_path)
    with progress_display() as progress:
        points = run_decode_sweep(path, settings, progress)
    finish(
        "decode",
        summarize(points, settings),
        targets={},
        settings={**asdict(settings), "cpus": cores, "model": str(path), "quick": quick},
        out=out,
        load_before=load_before,
        started_at=started_at,
        render=render,
    )
