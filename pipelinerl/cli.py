"""The ``pipelinerl`` command.

Heavy libraries (torch, transformers, DeepSpeed) are imported only inside the commands that need
them, so ``pipelinerl --help`` answers at once and a bad configuration is reported before any of
them loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(
    help="PipelineRL: on-policy RL of language models with in-flight weight updates, and its baselines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()

ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="TOML experiment file (default: the embedded default).")
]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override one setting: section.key=value (repeatable)."),
]


def _load(config_path: Path | None, overrides: list[str] | None):  # type: ignore[no-untyped-def]
    from pipelinerl.platform.config import ConfigError, load_config

    try:
        return load_config(config_path, overrides or [])
    except ConfigError as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(2) from None


def _log_to_console() -> None:
    """Library progress (the warm-start, warnings) goes through the same console as the live view."""
    import logging

    from rich.logging import RichHandler

    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[RichHandler(console=console)])


@app.command()
def run(config: ConfigOption = None, set_: SetOption = None) -> None:
    """Run the three stages (actor, preprocessor, trainer) on this machine and report what was learned."""
    resolved = _load(config, set_)
    _log_to_console()
    from pipelinerl.platform.transport import PortInUseError
    from pipelinerl.workers.launcher import StageFailed, launch
    from pipelinerl.workers.progress import ProgressView

    view = ProgressView(console, resolved)
    try:
        with view:
            result = launch(resolved, on_records=view.add_records, on_status=view.set_status)
    except (PortInUseError, StageFailed, FileNotFoundError) as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None
    view.print_summary(result.summary, result.run_dir)


config_app = typer.Typer(help="Inspect configurations.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("show")
def config_show(config: ConfigOption = None, set_: SetOption = None) -> None:
    """Validate and print the resolved configuration (every field, with defaults)."""
    from pipelinerl.platform.config import flatten

    resolved = _load(config, set_)
    for key, value in flatten(resolved).items():
        console.print(f"{key} = {value!r}", highlight=False)


@app.command()
def warmstart(config: ConfigOption = None, set_: SetOption = None) -> None:
    """Build (or find in the cache) the embedded tiny model, warm-started on the task."""
    resolved = _load(config, set_)
    _log_to_console()
    from pipelinerl.workers.launcher import resolve_model

    path = resolve_model(resolved, console=console)
    console.print(f"warm-started model: {path}")


if __name__ == "__main__":
    app()
