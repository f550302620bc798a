"""``pipelinerl bench``: measure the platform's speed and record it under ``docs/benchmarks/``.

Each command writes one JSON record (``docs/benchmarks/<name>.json`` unless ``--out`` says
otherwise; see ``report.py``) and prints its markdown table. ``--quick`` runs small sizes that
prove the benchmark works in seconds (what the tests run); its numbers mean nothing.
A new benchmark is one more ``@bench_app.command()`` here and a module beside this one; the commands
that measure whole runs live in ``cli_runs.py`` and are registered at the end of this module.

Heavy libraries load inside the commands, so ``pipelinerl bench --help`` answers at once.
"""

from __future__ import annotations

import importlib.util
import subprocess
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from pipelinerl.bench import cli_runs
from pipelinerl.bench.cli_support import (
    ModelOption,
    OutOption,
    QuickOption,
    RunDirOption,
    SeedOption,
    ThreadsOption,
    console,
    fail,
    finish,
    model_path_or_default,
    progress_display,
)

bench_app = typer.Typer(
    help="Benchmarks: learning speed, engine and transport speed, written to docs/benchmarks/<name>.json.",
    no_args_is_help=True,
)


def _run_in_vllm_env(arguments: list[str]) -> int:
    """``pipelinerl <arguments>`` with the vLLM environment's interpreter; its exit code."""
    from pipelinerl.launch.stages import vllm_python

    python = vllm_python()
    if not python.is_file():
        raise fail(
            f"--engine vllm needs the vLLM environment, and {python} does not exist: run `make vllm-env`"
        )
    console.print(f"running in the vLLM environment: {python}", markup=False, highlight=False)
    return subprocess.run([str(python), "-m", "pipelinerl.cli", *arguments], check=False).returncode


@bench_app.command()
def decode(
    in_flight: Annotated[
        str, typer.Option("--in-flight", help="The values of H to measure, comma-separated.")
    ] = "4,8,16,24,32,48,64",
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", min=1, help="Longest completion (actor.max_new_tokens).")
    ] = 96,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Repeats at each H (the median).")] = 3,
    cpus: Annotated[
        str | None,
        typer.Option(
            "--cpus", help="Cores to confine the engine to, comma-separated (the run's actor.cpus)."
        ),
    ] = None,
    model_path: ModelOption = None,
    quick: QuickOption = False,
    threads: ThreadsOption = 1,
    seed: SeedOption = 0,
    out: OutOption = None,
) -> None:
    """The engine's decode step against H, the sequences in flight (for `plan calibrate --engine-record`)."""
    from pipelinerl.bench.decode import decode_command

    decode_command(in_flight, max_new_tokens, repeats, cpus, model_path, quick, threads, seed, out)


@bench_app.command()
def engine(
    engine_names: Annotated[
        list[str] | None,
        typer.Option(
            "--engine",
            help="Inference engine to measure (transformers, vllm); repeat it to measure several side by "
            "side on the same workload. The first is the record's reference (default: transformers).",
        ),
    ] = None,
    in_flight: Annotated[
        int | None,
        typer.Option("--in-flight", min=1, help="H: sequences in flight, and the static batch size."),
    ] = None,
    prompts: Annotated[
        int | None,
        typer.Option("--prompts", min=1, help="Prompts in the workload (each sampled G = 4 times)."),
    ] = None,
    update_interval: Annotated[
        float | None,
        typer.Option(
            "--update-interval",
            min=0.01,
            help="Seconds between in-flight weight updates (default: the run's step time with --run-dir, "
            "else the main job's measured 0.88 s).",
        ),
    ] = None,
    repeats: Annotated[
        int | None,
        typer.Option("--repeats", min=1, help="Repeats of each measurement (medians are reported)."),
    ] = None,
    run_dir: RunDirOption = None,
    model_path: ModelOption = None,
    quick: QuickOption = False,
    threads: ThreadsOption = 1,
    seed: SeedOption = 0,
    out: OutOption = None,
    recorded_command: Annotated[
        str | None,
        typer.Option(
            "--recorded-command", hidden=True, help="The command as typed (set when re-run in .venv-vllm)."
        ),
    ] = None,
) -> None:
    """Continuous batching (H in flight) against static `generate` batches; the in-flight update pause.

    `--engine transformers --engine vllm` measures both engines side by side on the same workload into docs/benchmarks/engine.json (vLLM with its KV cache kept, and recomputed, at updates).
    """  # noqa: E501 (one line: the help text's paragraph)
    from pipelinerl.bench.engine_factories import ENGINES
    from pipelinerl.bench.report import command_line, default_path

    names = engine_names or ["transformers"]
    for name in names:
        if name not in ENGINES:
            raise fail(f"--engine {name!r} is not available; valid: {', '.join(sorted(ENGINES))}")
    if len(set(names)) < len(names):
        raise fail(f"--engine given twice for the same engine: {' '.join(names)}")
    # engine.json is the reference record (transformers first); other selections get their own name.
    out = out or default_path("engine" if names[0] == "transformers" else "engine-" + "-".join(names))
    if "vllm" in names and importlib.util.find_spec("vllm") is None:
        # vLLM lives in its own environment (DESIGN.md, "Environments"): run this command there.
        options: dict[str, Any] = {
            "--in-flight": in_flight,
            "--prompts": prompts,
            "--update-interval": update_interval,
            "--repeats": repeats,
            "--run-dir": run_dir,
            "--model-path": model_path_or_default(model_path),  # resolved here: the warm start needs .venv
            "--threads": threads,
            "--seed": seed,
            "--out": out,
            "--recorded-command": command_line(),
        }
        arguments = [part for name in names for part in ("--engine", name)]
        arguments += [
            part for option, value in options.items() if value is not None for part in (option, str(value))
        ]
        raise typer.Exit(_run_in_vllm_env(["bench", "engine", *arguments, *(["--quick"] if quick else [])]))
    from pipelinerl.bench.report import load_average

    load_before, started_at = load_average(), datetime.now(UTC)
    from pipelinerl.bench.engine import run_engine_bench, step_interval_from_run_dir
    from pipelinerl.bench.engine_record import render_engine_table, summarize
    from pipelinerl.bench.engine_workload import EngineBenchSettings

    overrides: dict[str, Any] = {"engines": tuple(names), "seed": seed, "threads": threads}
    if in_flight is not None:
        overrides["in_flight"] = in_flight
    if prompts is not None:
        overrides["num_prompts"] = prompts
    if repeats is not None:
        overrides["repeats"] = repeats
    if update_interval is not None:
        overrides.update(update_interval_s=update_interval, update_interval_source="--update-interval")
    elif run_dir is not None:
        try:
            interval, source = step_interval_from_run_dir(run_dir)
        except (FileNotFoundError, ValueError) as error:
            raise fail(str(error)) from None
        overrides.update(update_interval_s=interval, update_interval_source=source)
    settings = EngineBenchSettings.quick(**overrides) if quick else EngineBenchSettings(**overrides)
    path = model_path_or_default(model_path)
    with progress_display() as progress:
        result = summarize(run_engine_bench(path, settings, progress))
    finish(
        "engine",
        result,
        targets=result["targets"],
        # "engine": the reference engine, as records of one engine had it (bench transport shows it)
        settings={"engine": names[0], **asdict(settings), "quick": quick},
        out=out,
        load_before=load_before,
        started_at=started_at,
        render=render_engine_table,
        command=recorded_command,
    )


@bench_app.command()
def transport(
    run_dir: RunDirOption = None,
    engine_json: Annotated[
        Path | None,
        typer.Option(
            "--engine-json",
            help="An engine benchmark record for the actor's rate (default: docs/benchmarks/engine.json if "
            "present; else the engine is measured now).",
        ),
    ] = None,
    model_path: ModelOption = None,
    quick: QuickOption = False,
    threads: ThreadsOption = 1,
    seed: SeedOption = 0,
    curve: Annotated[
        bool,
        typer.Option(
            "--curve/--plain",
            help="CurveZMQ on both paths, as every run has it (default), or plain TCP to measure its cost.",
        ),
    ] = True,
    out: OutOption = None,
) -> None:
    """Rollouts/s, MB/s and latency of the ZeroMQ path against raw pyzmq; headroom over the actor."""
    from pipelinerl.bench.report import default_path, load_average, target_check

    load_before, started_at = load_average(), datetime.now(UTC)
    from pipelinerl.bench.actor_rate import (
        actor_rate_from_engine_json,
        actor_rate_from_run_dir,
        measure_actor_rate,
    )
    from pipelinerl.bench.transport import TransportBenchSettings, render_transport_table, run_transport_bench

    settings = (
        TransportBenchSettings.quick(seed=seed, curve=curve)
        if quick
        else TransportBenchSettings(seed=seed, curve=curve)
    )
    with progress_display() as progress:
        try:
            if run_dir is not None:
                actor_rate = actor_rate_from_run_dir(run_dir)
            elif engine_json is not None or default_path("engine").is_file():
                actor_rate = actor_rate_from_engine_json(engine_json or default_path("engine"))
            else:
                actor_rate = measure_actor_rate(model_path_or_default(model_path), threads, quick, progress)
        except (FileNotFoundError, ValueError, KeyError) as error:
            raise fail(str(error)) from None
        result = run_transport_bench(settings, actor_rate, progress)
    finish(
        "transport",
        result,
        targets={"headroom_over_actor": target_check(result["headline"]["headroom_over_actor"], at_least=20)},
        settings={**asdict(settings), "quick": quick, "threads": threads},
        out=out,
        load_before=load_before,
        started_at=started_at,
        render=render_transport_table,
    )


@bench_app.command()
def weights(
    bucket_mib: Annotated[
        str,
        typer.Option(
            "--bucket-mib", help="Bucket sizes to compare, comma-separated MiB; 0 = one broadcast per tensor."
        ),
    ] = "0,4,32,256",
    hidden_size: Annotated[
        int, typer.Option("--hidden-size", min=64, help="The model's hidden size.")
    ] = 1024,
    layers: Annotated[int, typer.Option("--layers", min=1, help="The model's layers.")] = 8,
    members: Annotated[int, typer.Option("--members", min=1, help="Weight-group members (actors).")] = 1,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Updates per bucket size.")] = 5,
    port: Annotated[int, typer.Option("--port", min=1024, help="First port (one per bucket size).")] = 28300,
    quick: QuickOption = False,
    out: OutOption = None,
) -> None:
    """A weight update from trainer rank 0 to the actors' weight group, by bucket size (weight_bucket_mib)."""
    from pipelinerl.bench.report import load_average
    from pipelinerl.bench.weights import MIB, WeightsBenchSettings, render_weights_table, run_weights_bench

    try:
        sizes = tuple(max(1, int(float(part) * MIB)) for part in bucket_mib.split(",") if part.strip())
    except ValueError:
        raise fail(f"--bucket-mib {bucket_mib!r} must be comma-separated numbers of MiB") from None
    if not sizes:
        raise fail("--bucket-mib names no bucket size")
    if quick:
        settings = WeightsBenchSettings.quick()
    else:
        settings = WeightsBenchSettings(
            hidden_size, layers, members=members, bucket_bytes=sizes, repeats=repeats
        )
    settings = WeightsBenchSettings(**{**settings.__dict__, "port": port})
    load_before, started_at = load_average(), datetime.now(UTC)
    with progress_display() as progress:
        result = run_weights_bench(settings, progress)
    finish(
        "weights",
        result,
        targets={},
        settings={**result.pop("settings"), "quick": quick},
        out=out,
        load_before=load_before,
        started_at=started_at,
        render=render_weights_table,
    )


@bench_app.command("plan")
def plan_speed(
    steps: Annotated[int, typer.Option("--steps", min=1, help="Optimizer steps simulated.")] = 1000,
    repeats: Annotated[
        int, typer.Option("--repeats", min=1, help="Times each case runs (fastest kept).")
    ] = 1,
    quick: QuickOption = False,
    out: OutOption = None,
) -> None:
    """The run simulator's CPU time on the paper's scale (48 and 128 actor GPUs; target: under 10 s)."""
    from pipelinerl.bench.plan_speed import PlanSpeedSettings, render_plan_speed_table, run_plan_speed_bench
    from pipelinerl.bench.report import load_average, target_check

    settings = PlanSpeedSettings.quick() if quick else PlanSpeedSettings(steps=steps, repeats=repeats)
    load_before, started_at = load_average(), datetime.now(UTC)
    with progress_display() as progress:
        result = run_plan_speed_bench(settings, progress)
    target = target_check(result["headline"]["cpu_s_128_gpus"], below=10.0) if settings.steps >= 1000 else {}
    finish(
        "plan",
        result,
        targets={"cpu_s_128_gpus_1000_steps": target} if target else {},
        settings={**asdict(settings), "quick": quick},
        out=out,
        load_before=load_before,
        started_at=started_at,
        render=render_plan_speed_table,
    )


# The whole-run benchmarks (bench/cli_runs.py).
for _command in (cli_runs.learning, cli_runs.recipes, cli_runs.faults, cli_runs.restart, cli_runs.figures):
    bench_app.command()(_command)
