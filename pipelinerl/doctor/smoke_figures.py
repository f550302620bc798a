"""What a smoke run's records say: its figures and whether it passed. Pure: the records come in.

A smoke run passes when the trainer made every step, actor 0 loaded at least one update in flight,
no weight bucket was refused and no weight-update notice was lost. Its figures are the ones a user
weighs a machine by: the update pause and its phases, the actor's tokens/s, the trainer's step time,
and the peak memory of each device.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pipelinerl.doctor.checks import Check
from pipelinerl.platform.tracking import metric_registry as registry

SECTION = "smoke run"
PHASE_PREFIX = registry.UPDATE_PHASE_MS.split("{")[0]


@dataclass
class SmokeFigures:
    steps: int
    updates_loaded: int
    update_pause_ms_median: float | None
    update_pause_ms_max: float | None
    update_phases_ms_median: dict[str, float]
    receive_ms_median: float | None
    actor_tokens_per_s_median: float | None
    trainer_step_s_median: float | None
    peak_memory_gib: dict[str, float] = field(default_factory=dict)  # device -> GiB
    buckets_refused: int = 0
    notices_lost: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def figures_of(
    trainer: Sequence[Mapping[str, Any]],
    actor: Sequence[Mapping[str, Any]],
    peak_memory_gib: Mapping[str, float],
) -> SmokeFigures:
    """The figures of a run from its trainer records (``metrics.jsonl``) and actor 0's."""
    trainer = [registry.canonical_record(dict(record), "trainer") for record in trainer]
    loads = [record for record in actor if registry.UPDATE_PAUSE_MS in record]
    pauses = [float(record[registry.UPDATE_PAUSE_MS]) for record in loads]
    phases: dict[str, list[float]] = {}
    for record in loads:
        for key, value in record.items():
            if key.startswith(PHASE_PREFIX):
                phases.setdefault(key.removeprefix(PHASE_PREFIX), []).append(float(value))
    rates = [
        float(record[registry.ACTOR_TOKENS_PER_S])
        for record in loads
        if float(record.get(registry.ACTOR_TOKENS_PER_S, 0)) > 0
    ]
    last = actor[-1] if actor else {}
    return SmokeFigures(
        steps=len(trainer),
        updates_loaded=len(loads),
        update_pause_ms_median=_median(pauses),
        update_pause_ms_max=max(pauses) if pauses else None,
        update_phases_ms_median={name: statistics.median(values) for name, values in phases.items()},
        receive_ms_median=_median(
            [
                float(record[registry.WEIGHTS_RECEIVE_MS])
                for record in loads
                if registry.WEIGHTS_RECEIVE_MS in record
            ]
        ),
        actor_tokens_per_s_median=_median(rates),
        trainer_step_s_median=_median([float(record[registry.TRAINER_STEP_S]) for record in trainer]),
        peak_memory_gib=dict(peak_memory_gib),
        buckets_refused=int(last.get(registry.ACTOR_WEIGHT_BUCKETS_REFUSED, 0)),
        notices_lost=int(last.get(registry.ACTOR_NOTICES_LOST, 0)),
    )


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} ms"


def smoke_checks(figures: SmokeFigures, steps_wanted: int, placement: str) -> list[Check]:
    """The smoke run as report lines: placement, steps, updates, and the figures."""
    data = figures.as_dict()
    checks = [Check(SECTION, "placement", "PASS", placement)]
    if figures.steps < steps_wanted:
        checks.append(
            Check(
                SECTION,
                "steps",
                "FAIL",
                f"{figures.steps} of {steps_wanted} steps trained",
                "read the run directory's *.log files for the stage that stopped",
                data,
            )
        )
    else:
        step = figures.trainer_step_s_median
        detail = (
            f"{figures.steps} steps, median step {step:.2f} s"
            if step is not None
            else f"{figures.steps} steps"
        )
        checks.append(Check(SECTION, "steps", "PASS", detail, data=data))
    if figures.updates_loaded == 0 or figures.buckets_refused or figures.notices_lost:
        checks.append(
            Check(
                SECTION,
                "in-flight updates",
                "FAIL",
                f"{figures.updates_loaded} loaded, {figures.buckets_refused} buckets refused, "
                f"{figures.notices_lost} notices lost",
                "check transport.weight_backend and the actor's log (actor0.log) in the run directory",
            )
        )
    else:
        phases = ", ".join(f"{name} {value:.1f}" for name, value in figures.update_phases_ms_median.items())
        checks.append(
            Check(
                SECTION,
                "in-flight updates",
                "PASS",
                f"{figures.updates_loaded} loaded; pause median {_ms(figures.update_pause_ms_median)} "
                f"(max {_ms(figures.update_pause_ms_max)}; phases, ms: {phases or '—'}); "
                f"receiving {_ms(figures.receive_ms_median)}",
            )
        )
    rate = figures.actor_tokens_per_s_median
    checks.append(
        Check(
            SECTION,
            "actor",
            "PASS" if rate else "WARN",
            f"{rate:,.0f} tokens/s (median between updates)" if rate else "no tokens/s recorded",
            "" if rate else "the actor loaded no update while generating: raise run.max_steps",
        )
    )
    memory = ", ".join(f"{device} {gib:.2f} GiB" for device, gib in figures.peak_memory_gib.items())
    checks.append(Check(SECTION, "peak memory", "PASS", memory or "not measured"))
    return checks
