"""Stages that share cores, fitted by simulation: how much faster each runs while the other waits.

On a machine where the actor and the trainer share the CPU cores (this 2-core machine), each runs
slower while the other is busy. The records measure a decode step and a trainer step with the other
stage mostly busy (``calibrate``'s fits), but not how much faster each goes alone. Two figures say it
(``CostModel.actor_alone_speedup``, ``trainer_alone_speedup``); they are chosen here by simulating the
calibration runs themselves (their configs, their completion lengths) over a grid of both and keeping
the pair whose predicted samples/s and trainer idle share, from the end of the first step on, are
nearest what the runs measured. A run never informs its own prediction unless it is among the
calibration runs (``scripts/plan_validation.py`` leaves it out). On GPUs, where each stage has its own
devices, both figures stay 0 (the shipped profiles leave them out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from pipelinerl.plan.calibrate import completion_lengths
from pipelinerl.plan.from_config import workload_from_config
from pipelinerl.plan.measured import measured
from pipelinerl.plan.profile import CostProfile, Figure
from pipelinerl.plan.simulate import simulate
from pipelinerl.plan.workload import Workload
from pipelinerl.platform.config import PipelineConfig

GRID = tuple(round(0.05 * step, 2) for step in range(13))  # 0 to 0.6
FIGURES = ("actor_alone_speedup", "trainer_alone_speedup")


def _case(run_dir: Path, prompt_tokens: int) -> tuple[Workload, dict[str, float]]:
    config = PipelineConfig.model_validate_json((run_dir / "config.json").read_text())
    workload = workload_from_config(config, completion_lengths([run_dir]), prompt_tokens)
    return workload, measured(run_dir)


def fit_alone_speedups(
    profile: CostProfile, run_dirs: Sequence[Path], prompt_tokens: int
) -> tuple[CostProfile, float]:
    """``profile`` with the pair of speed-ups that simulates ``run_dirs`` closest to what they measured
    (squared log error of samples/s plus squared error of the trainer's idle share, summed over the
    runs), and that error."""
    cases = [_case(run_dir, prompt_tokens) for run_dir in run_dirs]
    base = profile.cost_model()
    best: tuple[float, float, float] | None = None
    for actor in GRID:
        for trainer in GRID:
            costs = replace(base, actor_alone_speedup=actor, trainer_alone_speedup=trainer)
            error = 0.0
            for workload, seen in cases:
                run = simulate(workload, costs)
                if run.steady_samples_per_s <= 0 or seen["steady_samples_per_s"] <= 0:
                    continue
                error += math.log(run.steady_samples_per_s / seen["steady_samples_per_s"]) ** 2
                error += (run.steady_trainer_idle - seen["trainer_idle"]) ** 2
            if best is None or error < best[2]:
                best = (actor, trainer, error)
    assert best is not None
    shown = ", ".join(run_dir.name for run_dir in run_dirs)
    source = (
        f"fitted by simulating {shown} over a grid of both speed-ups (samples/s and trainer idle after the "
        "first step nearest the runs'; plan/contention.py)"
    )
    figures = dict(profile.figures)
    figures["actor_alone_speedup"] = Figure(value=best[0], unit="share of a decode step", source=source)
    figures["trainer_alone_speedup"] = Figure(value=best[1], unit="share of a trainer step", source=source)
    return profile.model_copy(update={"figures": figures}), best[2]
