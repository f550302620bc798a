"""``pipelinerl plan``: what a configuration would do, simulated under a cost profile, mode beside mode."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pipelinerl.plan.calibrate import CalibrationError, calibrate, completion_lengths
from pipelinerl.plan.from_config import workload_from_config
from pipelinerl.plan.lengths import LENGTH_FORMS, Lengths, parse_lengths
from pipelinerl.plan.profile import ProfileError, load_profile
from pipelinerl.plan.simulate import SimulatedRun, simulate
from pipelinerl.platform.config import ConfigError, load_config

console = Console()
plan_app = typer.Typer(
    help="Predict a run's speed and staleness before launching it (a simulation under a cost profile).",
    invoke_without_command=True,
)


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}", soft_wrap=True, highlight=False)
    return typer.Exit(2)


@plan_app.callback()
def plan_command(
    context: typer.Context,
    profile: Annotated[
        Path | None, typer.Option("--profile", "-p", help="Cost profile (JSON: plan/profile.py).")
    ] = None,
    lengths: Annotated[
        str | None, typer.Option("--lengths", help=f"Completion lengths: {LENGTH_FORMS}.")
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML experiment file.")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="Override a setting (repeatable).")
    ] = None,
    modes: Annotated[
        str, typer.Option("--modes", help="Modes to simulate, comma-separated.")
    ] = "pipeline,conventional",
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", min=0, help="Tokens per prompt.")] = 100,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the drawn lengths.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Predict the configuration's run before launching it: simulated in each mode under a cost
    profile (samples/s, idle shares, lag)."""
    if context.invoked_subcommand is not None:
        return
    if profile is None or lengths is None:
        raise _fail("give --profile PROFILE.json and --lengths (" + LENGTH_FORMS + ")")
    try:
        resolved = load_config(config, set_ or [])
    except ConfigError as error:
        raise _fail(str(error)) from None
    try:
        costs = load_profile(profile).cost_model()
        if lengths.startswith("run:"):
            drawn: Lengths = completion_lengths([Path(part) for part in lengths[4:].split(",")])
        else:
            drawn = parse_lengths(lengths, resolved.actor.max_new_tokens)
        workloads = {
            mode: workload_from_config(resolved, drawn, prompt_tokens, mode) for mode in modes.split(",")
        }
    except (ProfileError, ValueError) as error:
        raise _fail(str(error)) from None
    runs = {mode: simulate(workload, costs, seed) for mode, workload in workloads.items()}
    if as_json:
        print(json.dumps({mode: asdict(run) for mode, run in runs.items()}, indent=2))
        return
    console.print(figures_table(runs))
    if "pipeline" in runs and "conventional" in runs:
        speedup = runs["pipeline"].samples_per_s / runs["conventional"].samples_per_s
        console.print(f"pipeline / conventional: {speedup:.2f}x samples/s", highlight=False)


def figures_table(runs: dict[str, SimulatedRun]) -> Table:
    table = Table("figure", *runs)
    rows = [
        ("time to the last step (s)", lambda r: f"{r.seconds:,.1f}"),
        ("samples/s", lambda r: f"{r.samples_per_s:,.2f}"),
        ("samples/s after the first step", lambda r: f"{r.steady_samples_per_s:,.2f}"),
        ("tokens/s", lambda r: f"{r.tokens_per_s:,.0f}"),
        ("actor idle", lambda r: f"{r.actor_idle:.2f}"),
        ("actor paused for updates", lambda r: f"{r.actor_paused:.3f}"),
        ("trainer idle", lambda r: f"{r.trainer_idle:.2f}"),
        ("trainer idle after the first step", lambda r: f"{r.steady_trainer_idle:.2f}"),
        ("lag mean / p90 / max", lambda r: f"{r.lag_mean:.2f} / {r.lag_p90} / {r.lag_max}"),
        ("sequences of 2+ versions", lambda r: f"{r.multi_version_sequences:,}"),
        ("dropped (max_lag)", lambda r: f"{r.dropped_stale:,}"),
    ]
    for name, show in rows:
        table.add_row(name, *(show(run) for run in runs.values()))
    return table


@plan_app.command("calibrate")
def calibrate_command(
    run_dirs: Annotated[list[Path], typer.Argument(help="Finished runs' directories (runs/<id>).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the profile (JSON).")],
    name: Annotated[str, typer.Option("--name", help="The profile's name.")] = "calibrated",
) -> None:
    """Fit a cost profile from finished runs' records (plan/calibrate.py says from which)."""
    try:
        profile = calibrate(run_dirs, name)
    except CalibrationError as error:
        raise _fail(str(error)) from None
    out.write_text(profile.model_dump_json(indent=2) + "\n")
    table = Table("figure", "value", "unit", "source")
    for figure_name, figure in profile.figures.items():
        table.add_row(figure_name, f"{figure.value:.4g}", figure.unit, figure.source)
    console.print(table)
    console.print(f"profile written to {out}", highlight=False)
