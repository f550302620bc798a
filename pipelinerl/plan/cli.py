"""``pipelinerl plan``: what a configuration would do, simulated under a cost profile, mode beside mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from pipelinerl.plan.calibrate import CalibrationError, calibrate, lengths_from
from pipelinerl.plan.cluster import CLUSTER_FORM, parse_cluster
from pipelinerl.plan.contention import fit_alone_speedups
from pipelinerl.plan.defaults import choose_profile, profile_lengths
from pipelinerl.plan.figures import sweep_figure
from pipelinerl.plan.lengths import LENGTH_FORMS
from pipelinerl.plan.predict import SWEEP_FORM, SweepPoint, parse_sweep
from pipelinerl.plan.profile import ProfileError, resolve_profile, shipped_profiles
from pipelinerl.plan.report import Plan, make_plan, save_plan, speedups
from pipelinerl.plan.simulate import SimulatedRun
from pipelinerl.platform.config import ConfigError, load_config

console = Console()
plan_app = typer.Typer(
    help="Predict a run's speed and staleness before launching it (a simulation under a cost profile).",
    invoke_without_command=True,
)


def _say(message: str, as_json: bool) -> None:
    """A line for the reader; with --json, on stderr (stdout is the JSON)."""
    (Console(stderr=True) if as_json else console).print(message, highlight=False, soft_wrap=True)


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}", soft_wrap=True, highlight=False)
    return typer.Exit(2)


@plan_app.callback()
def plan_command(
    context: typer.Context,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile", "-p", help="Cost profile: a JSON file, or a shipped one's name (plan profiles)."
        ),
    ] = None,
    lengths: Annotated[
        str | None, typer.Option("--lengths", help=f"Completion lengths: {LENGTH_FORMS}.")
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML experiment file.")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="Override a setting (repeatable).")
    ] = None,
    cluster: Annotated[
        str | None, typer.Option("--cluster", help=f"Plan for this cluster (a GPU profile): {CLUSTER_FORM}.")
    ] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help=f"Vary one setting: {SWEEP_FORM}.")] = None,
    modes: Annotated[
        str,
        typer.Option(
            "--modes",
            help="Modes to simulate, comma-separated: pipeline, conventional, async, colocated (conventional "
            "rounds on every GPU of --cluster: the published baselines').",
        ),
    ] = "pipeline,conventional",
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", min=0, help="Tokens per prompt.")] = 100,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the drawn lengths.")] = 0,
    figure: Annotated[
        Path | None, typer.Option("--figure", help="With --sweep: write its figure here (.png or .svg).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    save: Annotated[
        bool,
        typer.Option("--save", help="Also save the plan under run.home/plans (the dashboard's Plan page)."),
    ] = False,
) -> None:
    """Predict the configuration's run before launching it: simulated in each mode under a cost
    profile (samples/s, idle shares, lag), on a cluster, or across a sweep of one setting."""
    if context.invoked_subcommand is not None:
        return
    try:
        resolved = load_config(config, set_ or [])
        if profile is None:
            gpu = parse_cluster(cluster).gpu if cluster else None
            model = str(resolved.model.path) if resolved.model.path is not None else None
            profile, why = choose_profile(gpu, model)
            _say(f"profile: {why} (--profile picks another)", as_json)
        if lengths is None:
            lengths, why = profile_lengths(resolve_profile(profile))
            _say(f"lengths: {why}, cut at actor.max_new_tokens={resolved.actor.max_new_tokens}", as_json)
        drawn = lengths_from(lengths, resolved.actor.max_new_tokens)
        mode_list = [mode.strip() for mode in modes.split(",") if mode.strip()]
        total = len(parse_sweep(sweep).values) if sweep else 0
        with Progress(console=console, disable=as_json or not total, transient=True) as progress:
            task = progress.add_task(f"sweeping {sweep}", total=total)
            made = make_plan(
                resolved,
                profile,
                drawn,
                lengths,
                mode_list,
                prompt_tokens,
                cluster,
                sweep,
                seed,
                on_point=lambda _: progress.advance(task),
            )
    except (ConfigError, ProfileError, ValueError) as error:  # ClusterError is a ValueError
        raise _fail(str(error)) from None
    if save:
        saved = save_plan(resolved.run.home, made.to_json(), name="sweep" if made.best else "plan")
        console.print(f"plan saved to {saved}", highlight=False, soft_wrap=True)
    if made.best is None:
        show_runs(made, as_json)
        return
    if figure is not None:
        title = f"{made.asked['profile']}" + (f", {cluster}" if cluster else "") + f": {made.swept} swept"
        sweep_figure(made.points, made.swept or "", made.best, title).savefig(figure, dpi=120)
    if as_json:
        print(json.dumps(made.to_json(), indent=2))
        return
    console.print(sweep_table(made.swept or "", made.points))
    console.print(f"recommended: {made.reason}", highlight=False, soft_wrap=True)
    if figure is not None:
        console.print(f"figure written to {figure}", highlight=False)


def show_runs(made: Plan, as_json: bool) -> None:
    if as_json:
        print(json.dumps(made.to_json()["runs"], indent=2))
        return
    runs = made.runs
    if made.asked["cluster"]:
        console.print(f"on {made.asked['cluster']}", highlight=False)
    console.print(figures_table(runs))
    asked_h = made.asked.get("max_in_flight")
    for mode, run in runs.items():
        if asked_h and run.in_flight < asked_h:
            console.print(
                f"{mode}: an engine's KV cache holds {run.in_flight} sequences at the mean length, not "
                f"actor.max_in_flight={asked_h}: H is capped there (as vLLM admits no more than it holds)",
                highlight=False,
                soft_wrap=True,
            )
    first, *others = list(runs)
    ratios = speedups(runs)
    for other in others:
        ratio = ratios.get(other, 0.0)  # 0: the other mode trained nothing
        console.print(
            f"{first} / {other}: {ratio:.2f}x samples/s; {runs[first].seconds:,.0f} s against "
            f"{runs[other].seconds:,.0f} s to the same {runs[first].samples:,} samples",
            highlight=False,
        )


def sweep_table(name: str, points: list[SweepPoint]) -> Table:
    modes = list(points[0].runs) if points else []
    table = Table(
        name, *(f"{mode} samples/s" for mode in modes), *(f"{mode} idle actors/trainer" for mode in modes)
    )
    table.add_column(f"{modes[0]} lag mean/max" if modes else "lag")
    for point in points:
        runs = [point.runs[mode] for mode in modes]
        table.add_row(
            str(point.value),
            *(f"{run.samples_per_s:,.2f}" for run in runs),
            *(f"{run.actor_idle:.2f} / {run.trainer_idle:.2f}" for run in runs),
            f"{runs[0].lag_mean:.2f} / {runs[0].lag_max}" if runs else "",
        )
    return table


def figures_table(runs: dict[str, SimulatedRun]) -> Table:
    table = Table("figure", *runs)
    rows = [
        ("sequences an engine holds (H)", lambda r: f"{r.in_flight:,}"),
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
    shared_cores: Annotated[
        bool,
        typer.Option(
            "--shared-cores/--own-devices",
            help="The runs' stages shared CPU cores: also fit how much faster each goes alone "
            "(plan/contention.py, by simulating the runs); --own-devices leaves that at 0.",
        ),
    ] = True,
    prompt_tokens: Annotated[
        int,
        typer.Option("--prompt-tokens", min=0, help="Tokens per prompt of the runs (for --shared-cores)."),
    ] = 40,
    engine_records: Annotated[
        list[Path] | None,
        typer.Option(
            "--engine-record",
            help="A `pipelinerl bench decode` record (repeatable): the decode step measured at each H, "
            "read by the simulator as a table instead of the runs' straight-line fit.",
        ),
    ] = None,
    weights_records: Annotated[
        list[Path] | None,
        typer.Option(
            "--weights-record",
            help="A `pipelinerl bench weights` record (repeatable): the weight link's bandwidth and cost a "
            "bucket, so the transfer follows a config's transport.weight_bucket_mib.",
        ),
    ] = None,
) -> None:
    """Fit a cost profile from finished runs' records (plan/calibrate.py says from which)."""
    try:
        profile = calibrate(run_dirs, name, engine_records or (), weights_records or ())
        if shared_cores:
            profile, _ = fit_alone_speedups(profile, run_dirs, prompt_tokens)
    except (CalibrationError, ValueError) as error:
        raise _fail(str(error)) from None
    out.write_text(profile.model_dump_json(indent=2) + "\n")
    table = Table("figure", "value", "unit", "source")
    for figure_name, figure in profile.figures.items():
        table.add_row(figure_name, f"{figure.value:.4g}", figure.unit, figure.source)
    if profile.decode_table is not None:
        points = ", ".join(f"{h}: {1000 * step:.3g} ms" for h, step in profile.decode_table.points)
        table.add_row("decode_table", points, "H: s", profile.decode_table.source)
    if profile.transfer is not None:
        link = profile.transfer
        table.add_row(
            "transfer (link)",
            f"{link.bytes_per_s / 1e9:.3g} GB/s, {1000 * link.per_bucket_s:.3g} ms a bucket, "
            f"{1000 * link.fixed_s:.3g} ms fixed",
            f"{link.update_bytes / 2**20:.1f} MiB an update",
            link.source,
        )
    console.print(table)
    console.print(f"profile written to {out}", highlight=False)


@plan_app.command("profiles")
def profiles_command() -> None:
    """The shipped cost profiles: name, hardware, what they describe."""
    table = Table("name", "hardware", "description")
    for name in shipped_profiles():
        profile = resolve_profile(name)
        hardware = profile.hardware
        where = (
            f"{hardware.model_params_b:g}B, {hardware.gpus_per_engine}x{hardware.gpu} an engine, trainer "
            f"figures on {hardware.trainer_gpus}"
            if hardware
            else "as calibrated (no cluster scaling)"
        )
        table.add_row(name, where, profile.description)
    console.print(table)
