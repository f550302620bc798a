"""``pipelinerl db …`` (the platform database's migrations) and ``pipelinerl runs …`` (recorded runs).

The database URL is ``--url``, else what the run configuration resolves (``tracking.database_url``,
``$PIPELINERL_DATABASE_URL``, the SQLite file in the platform home), with ``--config``/``--set`` read
as ``pipelinerl run`` reads them. SQLAlchemy and Alembic are imported inside the commands only, so
``pipelinerl --help`` stays fast. A failure (bad URL, unreachable server, unknown run) is one line
and exit code 2.

    pipelinerl db upgrade --url postgresql://postgres@127.0.0.1:5432/platform
    pipelinerl runs list --limit 20
    pipelinerl runs show 20261122-0430
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from pipelinerl.platform.tracking.liveness import HEARTBEAT_STALE_S

if TYPE_CHECKING:
    from pipelinerl.platform.tracking.store import PlatformStore

console = Console()
# Widest a table is printed; far beyond any row these tables hold.
TABLE_WIDTH_LIMIT = 1000

db_app = typer.Typer(help="Migrate the platform database (Alembic).", no_args_is_help=True)
runs_app = typer.Typer(help="Runs recorded in the platform database.", no_args_is_help=True)

UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="SQLAlchemy URL of the platform database (default: from the configuration, "
        "$PIPELINERL_DATABASE_URL, or the SQLite file in the platform home).",
    ),
]
ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="TOML experiment file (default: the embedded default).")
]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override one setting: section.key=value (repeatable)."),
]


def _fail(message: str) -> NoReturn:
    console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def resolve_url(url: str | None, config_path: Path | None, overrides: list[str] | None) -> str:
    """``--url`` if given, else the URL the run configuration resolves."""
    if url:
        return url
    from pipelinerl.platform.config import ConfigError, load_config
    from pipelinerl.platform.tracking.db import database_url

    try:
        return database_url(load_config(config_path, overrides or []))
    except ConfigError as error:
        _fail(str(error))


@contextlib.contextmanager
def open_store(url: str) -> Iterator[PlatformStore]:
    """The store at ``url`` (upgraded to head); an unusable database or unknown run ends the command."""
    from pipelinerl.platform.tracking.db import PlatformDatabaseError
    from pipelinerl.platform.tracking.store import PlatformStore

    try:
        with PlatformStore(url) as store:
            yield store
    except PlatformDatabaseError as error:
        _fail(str(error))
    except LookupError as error:
        _fail(str(error.args[0]) if error.args else str(error))


@db_app.command("upgrade")
def db_upgrade(
    url: UrlOption = None,
    revision: Annotated[str, typer.Option("--revision", help="Target revision.")] = "head",
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """Migrate the platform database up to a revision (creates the tables on a fresh database)."""
    from pipelinerl.platform.tracking.db import PlatformDatabaseError, current_revision, display_url, upgrade

    resolved = resolve_url(url, config, set_)
    try:
        upgrade(resolved, revision)
        now = current_revision(resolved)
    except PlatformDatabaseError as error:
        _fail(str(error))
    console.print(f"platform database {display_url(resolved)} is at revision {now}", highlight=False)


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[
        str, typer.Option("--revision", help="Target revision; 'base' drops every platform table.")
    ],
    url: UrlOption = None,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """Migrate the platform database down to a revision."""
    from pipelinerl.platform.tracking.db import (
        PlatformDatabaseError,
        current_revision,
        display_url,
        downgrade,
    )

    resolved = resolve_url(url, config, set_)
    try:
        downgrade(resolved, revision)
        now = current_revision(resolved)
    except PlatformDatabaseError as error:
        _fail(str(error))
    console.print(
        f"platform database {display_url(resolved)} is at revision {now or 'base (no platform tables)'}",
        highlight=False,
    )


@db_app.command("current")
def db_current(url: UrlOption = None, config: ConfigOption = None, set_: SetOption = None) -> None:
    """Print the revision the platform database is at, and the newest one available."""
    from pipelinerl.platform.tracking.db import (
        PlatformDatabaseError,
        current_revision,
        display_url,
        head_revision,
    )

    resolved = resolve_url(url, config, set_)
    try:
        now = current_revision(resolved)
        head = head_revision()
    except PlatformDatabaseError as error:
        _fail(str(error))
    if now is None:
        state = f"not migrated (run `pipelinerl db upgrade`; head is {head})"
    elif now == head:
        state = f"{now} (head)"
    else:
        state = f"{now} (head is {head}; run `pipelinerl db upgrade`)"
    console.print(f"platform database {display_url(resolved)}: revision {state}", highlight=False)


@runs_app.command("list")
def runs_list(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Most runs to show, newest first.")] = 50,
    silent_after: Annotated[
        float,
        typer.Option(
            "--silent-after",
            min=1.0,
            help="Seconds without a heartbeat after which a running run whose launcher is on another host "
            "counts as crashed (a launcher on this host is checked directly).",
        ),
    ] = HEARTBEAT_STALE_S,
    url: UrlOption = None,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """The most recent runs: status, duration, steps, final held-out success, MLflow run id.

    A run still marked running whose launcher is gone (its process, on this host; else its heartbeat
    silent) is marked crashed first, here and in MLflow, and both get what its run directory holds and
    they lack."""
    with open_store(resolve_url(url, config, set_)) as store:
        from pipelinerl.platform.tracking.catch_up import mark_crashed_and_catch_up

        uri = _mlflow_uri(config, set_)
        crashed = mark_crashed_and_catch_up(store, uri, silent_after)
        if crashed:
            console.print(
                f"marked {len(crashed)} run(s) crashed (launcher gone): "
                + ", ".join(run.id for run, _ in crashed),
                highlight=False,
                soft_wrap=True,
            )
            for _, caught in crashed:
                console.print(f"caught up {caught.describe()}", highlight=False, soft_wrap=True)
        runs = store.list_runs(limit)
    if not runs:
        console.print("no runs recorded yet (pipelinerl run records each run here)")
        return
    table = Table(title="runs", title_justify="left")
    table.add_column("id", no_wrap=True)
    table.add_column("name")
    table.add_column("mode")
    table.add_column("status")
    table.add_column("started", no_wrap=True)
    table.add_column("duration", justify="right", no_wrap=True)
    table.add_column("steps", justify="right")
    table.add_column("eval success", justify="right")
    table.add_column("MLflow run", no_wrap=True)
    for run in runs:
        table.add_row(
            escape(run.id),
            escape(run.name),
            escape(run.mode),
            _status(run.status),
            _time(run.started_at),
            _duration(run.duration_s),
            str(run.steps),
            _number((run.summary or {}).get("eval_success_end"), ".3f"),
            escape(run.mlflow_run_id or "—"),
        )
    _print_whole_rows(table)


def _mlflow_uri(config_path: Path | None, overrides: list[str] | None) -> str | None:
    """The MLflow store of the CLI's configuration; None (said) when the configuration does not load."""
    from pipelinerl.platform.config import load_config
    from pipelinerl.platform.tracking.mlflow_store import mlflow_uri

    try:
        return mlflow_uri(load_config(config_path, overrides or []))
    except ValueError as error:  # ConfigError
        console.print(f"[yellow]note:[/yellow] MLflow not written: {escape(str(error))[:200]}")
        return None


@runs_app.command("show")
def runs_show(
    run: Annotated[str, typer.Argument(help="Run id, or a prefix that names one run.")],
    url: UrlOption = None,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """One run: its fields and summary, then its per-step statistics."""
    with open_store(resolve_url(url, config, set_)) as store:
        detail = store.get_run(run)
        children = store.child_runs(detail.run.id)
    row = detail.run
    fields = Table(show_header=False, title=f"run {escape(row.id)}", title_justify="left")
    fields.add_column("field", style="bold")
    fields.add_column("value")
    for name, value in (
        ("name", row.name),
        ("mode", row.mode),
        ("status", _status(row.status)),
        ("started", _time(row.started_at)),
        ("ended", _time(row.ended_at)),
        ("duration", _duration(row.duration_s)),
        ("steps", str(row.steps) if row.steps or not children else f"— (its {len(children)} runs train)"),
        ("policy versions", str(len(detail.policy_versions))),
        ("MLflow run", row.mlflow_run_id or "—"),
        ("Prefect flow run", row.prefect_flow_run_id or "—"),
        ("parent run", row.parent_run_id or "—"),
    ):
        fields.add_row(name, value if name == "status" else escape(value))
    for key, value in _flat_summary(row.summary or {}):
        fields.add_row(escape(f"summary.{key}"), _summary_value(value))
    console.print(fields)
    if children:
        table = Table(title="runs under it", title_justify="left")
        for name in ("run", "mode", "status", "steps", "duration", "held-out success", "lag mean", "ESS"):
            table.add_column(name, justify="left" if name in ("run", "mode", "status") else "right")
        for child in children:
            summary = child.summary or {}
            table.add_row(
                escape(child.id),
                escape(child.mode),
                _status(child.status),
                str(child.steps),
                _duration(child.duration_s),
                _number(summary.get("eval_success_end"), ".1%"),
                _number(summary.get("lag_mean"), ".2f"),
                _number(summary.get("ess_mean"), ".3f"),
            )
        _print_whole_rows(table)
    if not detail.steps:
        if not children:
            console.print("no steps recorded")
        return
    steps = Table(title="steps", title_justify="left")
    for name in ("version", "reward", "ESS", "lag mean", "lag p90", "lag max", "samples"):
        steps.add_column(name, justify="right")
    for step in detail.steps:
        steps.add_row(
            str(step.version),
            _number(step.reward_mean, ".3f"),
            _number(step.ess, ".3f"),
            _number(step.lag_mean, ".2f"),
            _number(step.lag_p90, ".1f"),
            _number(step.lag_max, "d"),
            _number(step.samples, "d"),
        )
    _print_whole_rows(steps)


def _print_whole_rows(table: Table) -> None:
    """Print at the table's natural width when the console is narrower: rows stay whole (for grep and
    scripts, and in a narrow terminal, which wraps them) instead of columns squeezed to nothing."""
    natural = Measurement.get(console, console.options.update(width=TABLE_WIDTH_LIMIT), table).maximum
    if natural <= console.width:
        console.print(table)
    else:  # Console.print never renders wider than the console it is called on
        Console(width=natural, force_terminal=console.is_terminal, no_color=console.no_color).print(table)


def _flat_summary(summary: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """A summary's fields one per row: a mapping's or a list's items under their dotted key."""
    rows: list[tuple[str, Any]] = []
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            rows += _flat_summary(value, f"{name}.")
        elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            for index, item in enumerate(value):
                rows += _flat_summary(item, f"{name}.{index}.")
        else:
            rows.append((name, value))
    return rows


def _summary_value(value: Any) -> str:
    """A summary field as a person reads it: floats to 4 significant digits, lists item by item."""
    if isinstance(value, float):
        return format(value, ".4g")
    if isinstance(value, list):
        return escape(", ".join(_summary_value(item) for item in value)) or "—"
    return "—" if value is None else escape(str(value))


def _number(value: Any, spec: str) -> str:
    if value is None:
        return "—"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(value, spec)
    return escape(str(value))


def _time(moment: datetime | None) -> str:
    return "—" if moment is None else moment.astimezone().strftime("%Y-%m-%d %H:%M")


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _status(status: str) -> str:
    colours = {"running": "cyan", "finished": "green", "failed": "red", "killed": "yellow", "crashed": "red"}
    colour = colours.get(status)
    return f"[{colour}]{status}[/{colour}]" if colour else status
