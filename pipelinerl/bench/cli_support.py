"""What every ``pipelinerl bench`` command shares: the console, common options, the progress display,
errors, and writing a record (``report.py``) with its table."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

if TYPE_CHECKING:
    from rich.progress import Progress

console = Console()

QuickOption = Annotated[
    bool, typer.Option("--quick", help="Small sizes: proves the benchmark runs (seconds).")
]
OutOption = Annotated[
    Path | None,
    typer.Option("--out", "-o", help="JSON record to write (default: docs/benchmarks/<name>.json)."),
]
ThreadsOption = Annotated[
    int, typer.Option("--threads", min=1, help="torch threads (the actor's default is 1).")
]
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Base experiment config (TOML); default: the embedded."),
]
SetOption = Annotated[
    list[str] | None, typer.Option("--set", "-s", help="Override on the base config: section.key=value.")
]
SeedOption = Annotated[int, typer.Option("--seed", min=0, help="Seed for prompts, sampling and rollouts.")]
# The options of the benchmarks that compare runs by held-out success (bench learning, bench recipes).
SeedsOption = Annotated[str, typer.Option("--seeds", help="Seeds, comma-separated (medians are reported).")]
StepsOption = Annotated[int, typer.Option("--steps", min=2, help="Optimizer steps of every run.")]
EvalEveryOption = Annotated[
    int, typer.Option("--eval-every", min=1, help="Versions between checkpoints evaluated on held-out.")
]
EvalProblemsOption = Annotated[int, typer.Option("--eval-problems", min=8, help="Held-out problems.")]
TargetGainOption = Annotated[
    float,
    typer.Option("--target-gain", min=0.0, help="Target = the warm-start's held-out success plus this."),
]
ModelOption = Annotated[
    Path | None,
    typer.Option(
        "--model-path",
        help="Local Hugging Face model directory (default: the embedded warm-started model, built if "
        "missing).",
    ),
]
RunDirOption = Annotated[
    Path | None,
    typer.Option(
        "--run-dir", help="A finished run directory (runs/<run-id>) to take the pipeline's rates from."
    ),
]


@contextlib.contextmanager
def progress_display() -> Iterator[Progress]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        yield progress


def fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}", soft_wrap=True, highlight=False)
    return typer.Exit(2)


def model_path_or_default(model_path: Path | None) -> Path:
    if model_path is not None:
        path = model_path.expanduser()
        if not (path / "config.json").is_file():
            raise fail(f"--model-path {str(path)!r} is not a Hugging Face model directory (no config.json)")
        return path
    from pipelinerl.launch.model_source import resolve_model
    from pipelinerl.platform.config import PipelineConfig

    return resolve_model(PipelineConfig(), console=console)


def finish(
    name: str,
    result: dict[str, Any],
    *,
    targets: dict,
    settings: dict,
    out: Path | None,
    load_before: list[float],
    started_at: datetime,
    render: Any,
    command: str | None = None,
) -> None:
    from pipelinerl.bench.report import build_record, default_path, write_record

    record = build_record(
        name,
        headline=result["headline"],
        settings=settings,
        details=result["details"],
        targets=targets,
        notes=result["notes"],
        load_before=load_before,
        started_at=started_at,
        command=command,
    )
    path = write_record(record, out or default_path(name))
    console.print(render(record), markup=False, highlight=False, soft_wrap=True)
    load = record["load_average"]
    console.print(
        f"\nload average (1/5/15 min) before {load['before']}, after {load['after']} on "
        f"{record['machine']['usable_cores']} cores; written to {path}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def parse_seeds(seeds: str) -> list[int]:
    """``--seeds`` as integers; a clear error (exit 2) for anything else, or for none, or a negative one."""
    try:
        values = [int(part) for part in seeds.split(",") if part.strip()]
    except ValueError:
        raise fail(f"--seeds {seeds!r} must be comma-separated integers") from None
    if not values or any(seed < 0 for seed in values):
        raise fail(f"--seeds needs one or more values >= 0 (got {seeds!r})")
    return values
