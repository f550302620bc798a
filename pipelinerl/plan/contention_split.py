"""Stages that share a machine, read off the runs' modes: each stage's cost beside the other and alone.

On a machine whose stages share a memory system (this 2-core machine: the actor and the trainer on a
core each, one L3 cache and memory bus), each stage runs slower while the other computes. The runs'
modes say when that was: in ``pipeline`` and ``async`` runs the two compute together (**beside**); in
a conventional run that trains only between rounds (``run.train_during_round=false``) each computes
while the other waits (**alone**). A conventional run that trains during the round is some of both
and is left out. So:

* the trainer's step is fitted on the *beside* runs' steps (the profile's costs are "with the other
  stage busy", ``plan/costs.py``), and ``trainer_alone_speedup`` is 1 minus the median of the *alone*
  steps over that fit at their tokens;
* the profile's decode step (its table, scaled to the pipeline runs' actors where ``calibrate`` was
  asked to: ``table_in_runs``) is taken as the actor's beside the trainer, and ``actor_alone_speedup``
  is 1 minus the median of the *alone* runs' decode step (H ÷ their actor's busy rate, H its config's)
  over that step at H.

Unlike ``plan/contention.py``'s fit by simulation, nothing here is searched: each figure is a ratio of
measured times, and a figure whose runs are missing keeps the profile's value.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pipelinerl.plan.calibrate import actor_records, decode_rate, fit_trainer_steps, step_records
from pipelinerl.plan.profile import CostProfile, Figure
from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.tracking import metric_registry as registry

Company = Literal["beside", "alone", "mixed"]


def company(config: PipelineConfig) -> Company:
    """Whether a run's trainer stepped while its actor decoded (beside), never did (alone), or both."""
    if config.run.mode in ("pipeline", "async"):
        return "beside"
    return "mixed" if config.run.train_during_round else "alone"


def split_contention(profile: CostProfile, run_dirs: Sequence[Path]) -> CostProfile:
    """``profile`` with its trainer step fitted on the runs that stepped beside the actor and both
    stages' speed-ups alone measured on the runs where each computed alone (the module says how)."""
    configs = {run: PipelineConfig.model_validate_json((run / "config.json").read_text()) for run in run_dirs}
    beside = [run for run, config in configs.items() if company(config) == "beside"]
    alone = [run for run, config in configs.items() if company(config) == "alone"]
    if not beside or not alone:
        return profile
    figures = dict(profile.figures)
    beside_steps = [r for run in beside for r in step_records(run)]
    base, per_token, per_sequence, log_sd = fit_trainer_steps(beside_steps)
    named = ", ".join(run.name for run in beside)
    source = (
        f"fitted on the {len(beside_steps)} steps of {named}, beside the actor (plan/contention_split.py)"
    )
    for figure, value in (
        ("train_base_s", base),
        ("train_per_token_s", per_token),
        ("train_per_sequence_s", per_sequence),
        ("train_step_log_sd", log_sd),
    ):
        unit = figures[figure].unit if figure in figures else "s"  # train_step_log_sd is optional
        figures[figure] = Figure(value=value, unit=unit, source=source)
    costs = profile.model_copy(update={"figures": figures}).cost_model()
    alone_names = ", ".join(run.name for run in alone)
    ratios = [
        float(r[registry.TRAINER_STEP_S])
        / costs.train_step_s(int(r[registry.TRAINER_TOKENS]), int(r[registry.TRAINER_SAMPLES]))
        for run in alone
        for r in step_records(run)
    ]
    figures["trainer_alone_speedup"] = Figure(
        value=max(0.0, 1.0 - statistics.median(ratios)),
        unit="share of a trainer step",
        source=f"1 - the median of {len(ratios)} steps of {alone_names} (the actor waiting) over the fit "
        "beside it",
    )
    decode = []
    for run in alone:
        held = configs[run].actor.max_in_flight
        for record in actor_records(run):
            if decode_rate(record) > 0:
                decode.append(held / decode_rate(record) / costs.decode_step_s(held, 0))
    if decode:
        figures["actor_alone_speedup"] = Figure(
            value=max(0.0, 1.0 - statistics.median(decode)),
            unit="share of a decode step",
            source=f"1 - the median of {len(decode)} actor records of {alone_names} (the trainer waiting: "
            "H / the busy rate) over the decode step at H",
        )
    return profile.model_copy(update={"figures": figures})
