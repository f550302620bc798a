"""``pipelinerl replay``, ``pipelinerl runs export`` and ``pipelinerl runs audit``: the commands over a
run's records: its replay (``launch/replay``), its portable bundle (``platform/bundles``) and the audit of
its prompts (``platform/prompt_records``). torch, DeepSpeed and MLflow load only in the replay's
processes and its tracking, never at ``--help``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pipelinerl.launch.replay import ReplayError, default_master_port, plan_replay, run_replay, track_what_if
from pipelinerl.launch.replay_check import check_replay
from pipelinerl.launch.replay_view import print_replay
from pipelinerl.platform.bundles import BundleError, export_bundle
from pipelinerl.platform.checkpoint import CheckpointError
from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.prompt_records import PromptAudit, PromptAuditError, audit_run
from pipelinerl.platform.tracking.db_cli import ConfigOption, SetOption, UrlOption, resolve_url

console = Console()


def replay_command(
    run_dir: Annotated[Path, typer.Argument(help="The recorded run's directory.")],
    from_: Annotated[
        int | None,
        typer.Option(
            "--from", help="Resume at the checkpoint at or before this version (default: the start)."
        ),
    ] = None,
    to: Annotated[
        int | None, typer.Option("--to", help="The last version to train (default: the last).")
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", "-s", help="What-if: another recipe on the same batches, section.key=value."),
    ] = None,
    tolerance: Annotated[
        float, typer.Option(min=0.0, help="Relative tolerance of the check (0: every value to the bit).")
    ] = 0.0,
    out: Annotated[
        Path | None, typer.Option(help="The replay's directory (default: RUN/replays/<time>).")
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(help="A local copy of the model the run started from (a bundle checks its digest)."),
    ] = None,
) -> None:
    """Train a run's recorded steps (a run directory or a bundle: runs export) again from a checkpoint,
    and check each step against the record (token log-probs, loss, ESS, gradient norm, the weights tensor
    by tensor); with --set, train the same batches under another recipe and show both."""
    try:
        plan = plan_replay(run_dir, from_, to, set_ or [], out, model)
    except ReplayError as error:
        console.print(f"[red]error:[/red] {error}", soft_wrap=True)
        raise typer.Exit(2) from None
    console.print(
        f"replaying versions {plan.first + 1}..{plan.last} of {plan.source} from {plan.model_path} "
        f"({plan.config.trainer.num_processes} rank(s)) into {plan.out}",
        soft_wrap=True,
        highlight=False,
    )
    started = time.time()
    with console.status("starting the replay") as spinner:
        try:
            run_replay(
                plan,
                default_master_port(plan.config.transport.host),
                lambda done: spinner.update(f"replayed {done} of {len(plan.versions)} steps"),
            )
        except ReplayError as error:
            console.print(f"[red]error:[/red] {error}", soft_wrap=True, highlight=False)
            raise typer.Exit(1) from None
    report = check_replay(
        plan.source, plan.out, plan.versions, plan.config.trainer.num_processes, tolerance, plan.what_if
    )
    print_replay(console, report, plan.out)
    try:
        tracked = track_what_if(plan, started)
    except Exception as error:  # noqa: BLE001 (the replay is done and kept: tracking it is a bonus)
        console.print(f"[yellow]not tracked:[/yellow] {error}", soft_wrap=True, highlight=False)
        tracked = None
    if tracked is not None:
        console.print(
            f"tracked as {tracked}, a child of {plan.source.name} in MLflow and the platform database "
            f"(the dashboard: /compare?run={plan.source.name}&run={tracked})",
            soft_wrap=True,
            highlight=False,
        )
    if report.first_divergence is not None:
        raise typer.Exit(1)


def export_command(
    run_dir: Annotated[Path, typer.Argument(help="The run's directory.")],
    bundle: Annotated[Path, typer.Option("--bundle", help="A new directory to write the bundle into.")],
    from_: Annotated[
        int | None, typer.Option("--from", help="First version a replay starts at (default: the start).")
    ] = None,
    to: Annotated[int | None, typer.Option("--to", help="Last version (default: the last recorded).")] = None,
    with_model: Annotated[
        bool, typer.Option(help="Copy the starting model in (else it is named by digest).")
    ] = False,
) -> None:
    """Write what reproduces a run's training (checkpoint, batches, token data, weight digests, config,
    metrics) into a bundle that `pipelinerl replay` reads on another machine."""
    source = run_dir.expanduser().resolve()
    try:
        ranks = PipelineConfig.model_validate_json((source / "config.json").read_text()).trainer.num_processes
        with console.status("exporting") as spinner:
            manifest = export_bundle(source, bundle.resolve(), ranks, from_, to, with_model, spinner.update)
    except (BundleError, CheckpointError, OSError, ValueError) as error:
        console.print(f"[red]error:[/red] {error}", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from None
    size = sum(path.stat().st_size for path in bundle.rglob("*") if path.is_file())
    console.print(
        f"bundle of {manifest.run_id}, versions {manifest.first + 1}..{manifest.last}: {len(manifest.files)} "
        f"files, {size / 2**20:.1f} MiB, in {bundle}; the starting model is "
        + ("in it" if manifest.model_included else f"named by its digest {manifest.model_digest[:16]}…"),
        soft_wrap=True,
        highlight=False,
    )


def audit_command(
    run: Annotated[
        str,
        typer.Argument(help="The run's directory, or its id (or a unique prefix) in the platform database."),
    ],
    url: UrlOption = None,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """Check that every prompt the run's actors handed out was trained exactly once in the surviving
    lineage, or dropped with its reason, or was in flight at the end; print what is off (exit 1).

    RUN is read from its run directory when it is one, else from the prompt ledger its tracker wrote in
    the platform database (--url, else the configuration's); both give the same report."""
    source = Path(run).expanduser()
    try:
        if source.is_dir():
            source = source.resolve()
            config_json = (source / "config.json").read_text()
            ranks = PipelineConfig.model_validate_json(config_json).trainer.num_processes
            name, audit = source.name, audit_run(source, ranks)
        else:
            name, audit = _audit_from_database(run, resolve_url(url, config, set_))
    except (PromptAuditError, OSError, ValueError) as error:
        console.print(f"[red]error:[/red] {error}", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from None
    print_audit(name, audit)


def _audit_from_database(run: str, url: str) -> tuple[str, PromptAudit]:
    """The audit of the run ``run`` names in the platform database at ``url``: its id, and the audit."""
    # SQLAlchemy: only for an audit from the database (`import pipelinerl.cli` must not load it).
    from pipelinerl.platform.tracking.db import PlatformDatabaseError, display_url  # noqa: PLC0415
    from pipelinerl.platform.tracking.store import PlatformStore  # noqa: PLC0415

    try:
        with PlatformStore(url) as store:
            run_id = store.find_run_id(run)
            records = store.prompt_records(run_id)
    except LookupError as error:
        raise PromptAuditError(
            f"{run!r} is not a run directory, and the platform database {display_url(url)!r} says: "
            f"{error.args[0] if error.args else error}"
        ) from None
    except PlatformDatabaseError as error:
        raise PromptAuditError(str(error)) from None
    if not any(records.handed_out.values()):
        raise PromptAuditError(
            f"run {run_id!r} has no prompt hand-outs in the platform database {display_url(url)!r}: a run "
            "recorded before revision 0004 (audit its run directory instead), or one that started no actor"
        )
    return run_id, records.audit()


def print_audit(name: str, audit: PromptAudit) -> None:
    """The audit's table and what is off; exit 1 if a prompt was skipped or trained twice."""
    table = Table(title=f"prompts of {name} ({audit.versions} steps in the surviving lineage)")
    columns = ("actor", "handed out", "trained once", "dropped", "in flight at the end", "not reached again")
    for column in (*columns, "skipped", "twice"):
        table.add_column(column, justify="right")
    for actor in audit.actors:
        dropped = ", ".join(f"{n} {reason}" for reason, n in sorted(actor.dropped.items())) or "0"
        table.add_row(
            str(actor.actor_id),
            str(actor.handed_out),
            str(actor.trained_once),
            dropped,
            str(len(actor.in_flight_at_end)),
            str(len(actor.not_reached)),
            f"[red]{len(actor.skipped)}[/red]" if actor.skipped else "0",
            f"[red]{len(actor.trained_twice)}[/red]" if actor.trained_twice else "0",
        )
    console.print(table)
    for actor in audit.actors:
        if actor.skipped:
            console.print(f"[red]actor {actor.actor_id}: skipped positions[/red] {actor.skipped[:20]}")
        if actor.trained_twice:
            console.print(f"[red]actor {actor.actor_id}: trained twice[/red] {actor.trained_twice[:20]}")
    if not audit.ok:
        raise typer.Exit(1)
    console.print(
        "[green]every prompt handed out was trained once, dropped with its reason, in flight at the "
        "end, or beyond where the surviving attempt got[/green]"
    )
