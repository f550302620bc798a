"""The simulator checked against measured runs: each configuration predicted from the *other* ones.

Given finished runs grouped by configuration (several seeds each), every configuration is predicted
with a profile calibrated only on the other configurations' runs (their records and completion
lengths) and compared with what its own runs measured: the median over its seeds, beside the spread,
so one slow run on a shared machine does not decide the comparison. The tolerances are issue 27's
acceptance. ``scripts/plan_validation.py`` runs the experiments and prints the table.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from pipelinerl.plan.calibrate import calibrate, completion_lengths
from pipelinerl.plan.contention import fit_alone_speedups
from pipelinerl.plan.contention_split import split_contention
from pipelinerl.plan.from_config import bucket_bytes_of, workload_from_config
from pipelinerl.plan.measured import measured
from pipelinerl.plan.profile import CostProfile
from pipelinerl.plan.simulate import SimulatedRun, simulate
from pipelinerl.platform.config import PipelineConfig

# figure -> (how far a prediction may be off, relative or absolute)
TOLERANCES: dict[str, tuple[float, str]] = {
    "steady_samples_per_s": (0.10, "relative"),
    "trainer_idle": (0.05, "absolute"),
    "actor_idle": (0.05, "absolute"),
    "lag_mean": (0.5, "absolute"),
    "lag_max": (1.0, "absolute"),
}
# the simulated figure compared with each measured one
SIMULATED: dict[str, str] = {
    "steady_samples_per_s": "steady_samples_per_s",
    "trainer_idle": "steady_trainer_idle",
    "actor_idle": "actor_idle",
    "lag_mean": "lag_mean",
    "lag_max": "lag_max",
}


@dataclass(frozen=True)
class Comparison:
    configuration: str
    measured: dict[str, float]  # median over the configuration's runs
    spread: dict[str, tuple[float, float]]  # lowest and highest of its runs
    predicted: dict[str, float]  # median over the same number of simulated seeds
    within: dict[str, bool]
    alone_speedups: tuple[float, float]  # the profile's (actor, trainer) speed-ups alone on shared cores

    @property
    def all_within(self) -> bool:
        return all(self.within.values())


# How the stages' sharing of the machine enters a profile: not at all (each stage on devices of its
# own), fitted by simulating the runs (plan/contention.py), or read off the runs' modes
# (plan/contention_split.py).
Contention = Literal["none", "simulate", "modes"]
CONTENTIONS: tuple[str, ...] = get_args(Contention)


def with_contention(
    profile: CostProfile, runs: Sequence[Path], prompt_tokens: int, contention: Contention
) -> CostProfile:
    if contention == "simulate":
        return fit_alone_speedups(profile, runs, prompt_tokens)[0]
    if contention == "modes":
        return split_contention(profile, runs)
    return profile


def within_tolerance(figure: str, measured_value: float, predicted_value: float) -> bool:
    tolerance, kind = TOLERANCES[figure]
    if kind == "relative":
        return abs(predicted_value - measured_value) <= tolerance * abs(measured_value)
    return abs(predicted_value - measured_value) <= tolerance + 1e-9


def compare(
    runs: Mapping[str, Sequence[Path]],
    prompt_tokens: int,
    contention: Contention = "simulate",
    predict: Sequence[str] | None = None,
    engine_records: Sequence[Path] = (),
    scale_table_to_runs: bool = False,
) -> list[Comparison]:
    """Each configuration of ``runs`` (its name -> its runs' directories, which differ only in their
    seeds; those named in ``predict`` when given) predicted from the others' runs and compared with its
    own; its config is its first run's; ``engine_records`` (``bench decode``) give the decode step at each
    H, which the runs' records would otherwise fit as a straight line (scaled to the other runs' actors
    with ``scale_table_to_runs``: ``calibrate.table_in_runs``). Without them the others must hold
    actor records taken with sequences in flight (``plan calibrate``): a conventional run's are taken
    between rounds, so it cannot be the only other run."""
    if len(runs) < 2:
        raise ValueError(f"{len(runs)} configuration(s): predicting one from the others needs 2 or more")
    if unknown := sorted(set(predict or ()) - set(runs)):
        raise ValueError(f"predict={unknown}: not among the configurations {sorted(runs)}")
    comparisons = []
    for name, own in runs.items():
        if predict is not None and name not in predict:
            continue
        if not own:
            raise ValueError(f"configuration {name!r} has no run")
        others = [run for key, group in runs.items() if key != name for run in group]
        profile = calibrate(others, "others", engine_records, scale_table_to_runs=scale_table_to_runs)
        profile = with_contention(profile, others, prompt_tokens, contention)
        config = PipelineConfig.model_validate_json((own[0] / "config.json").read_text())
        costs = profile.cost_model(bucket_bytes_of(config))
        workload = workload_from_config(config, completion_lengths(others), prompt_tokens)
        simulated: list[SimulatedRun] = [simulate(workload, costs, seed) for seed in range(len(own))]
        seen = [measured(run) for run in own]
        measured_median = {figure: statistics.median(s[figure] for s in seen) for figure in SIMULATED}
        predicted = {
            figure: statistics.median(float(getattr(run, simulated_figure)) for run in simulated)
            for figure, simulated_figure in SIMULATED.items()
        }
        comparisons.append(
            Comparison(
                configuration=name,
                measured=measured_median,
                spread={
                    figure: (min(s[figure] for s in seen), max(s[figure] for s in seen))
                    for figure in SIMULATED
                },
                predicted=predicted,
                within={f: within_tolerance(f, measured_median[f], predicted[f]) for f in SIMULATED},
                alone_speedups=(costs.actor_alone_speedup, costs.trainer_alone_speedup),
            )
        )
    return comparisons


def markdown_table(comparisons: Sequence[Comparison]) -> str:
    """Measured (median, and the runs' range) / predicted per figure; a figure outside its tolerance
    is marked with a cross."""

    def cell(c: Comparison, figure: str, digits: int) -> str:
        low, high = c.spread[figure]
        mark = "" if c.within[figure] else " ✗"
        seen, predicted = c.measured[figure], c.predicted[figure]
        text = f"{seen:.{digits}f} ({low:.{digits}f}–{high:.{digits}f}) / {predicted:.{digits}f}"
        if figure == "steady_samples_per_s" and c.measured[figure]:
            text += f" ({c.predicted[figure] / c.measured[figure] - 1:+.0%})"
        return text + mark

    lines = [
        "| configuration | samples/s measured (range) / predicted | trainer idle | actor idle | lag mean "
        "| lag max | within all |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        lines.append(
            f"| {c.configuration} | {cell(c, 'steady_samples_per_s', 1)} | {cell(c, 'trainer_idle', 2)} "
            f"| {cell(c, 'actor_idle', 2)} | {cell(c, 'lag_mean', 2)} | {cell(c, 'lag_max', 0)} "
            f"| {'yes' if c.all_within else 'no'} |"
        )
    return "\n".join(lines)
