"""A replay's report in the terminal: one row per step, the record beside the replay, and the verdict."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from pipelinerl.launch.replay_check import COMPARED, ReplayReport
from pipelinerl.platform.tracking import metric_registry as registry

SHORT = {registry.LOSS: "loss", registry.ESS: "ESS", registry.TRAINER_GRAD_NORM: "grad norm"}


def _value(values: dict[str, float], name: str) -> str:
    return f"{values[name]:.6g}" if name in values else "-"


def print_replay(console: Console, report: ReplayReport, out: Path) -> None:
    table = Table(title="what-if replay: the record and the replay" if report.what_if else "replay check")
    table.add_column("version", justify="right")
    for name in COMPARED:
        table.add_column(f"{SHORT[name]}\nrecord", justify="right")
        table.add_column(f"{SHORT[name]}\nreplay", justify="right")
    if not report.what_if:
        table.add_column("agrees")
    for step in report.steps:
        cells = [str(step.version)]
        for name in COMPARED:
            cells += [_value(step.recorded, name), _value(step.replayed, name)]
        if not report.what_if:
            cells.append("[green]yes[/green]" if step.difference is None else "[red]no[/red]")
        table.add_row(*cells)
    console.print(table)
    divergence = report.first_divergence
    if report.what_if:
        console.print(f"what-if replay of {len(report.steps)} steps, not checked; its records: {out}")
    elif divergence is None:
        exact = "to the bit" if report.tolerance == 0.0 else f"within a relative {report.tolerance:g}"
        console.print(
            f"[green]every step agrees with the record {exact}[/green] ({len(report.steps)} steps: token "
            f"log-probs, loss, ESS, gradient norm and every weight tensor); records: {out}",
            soft_wrap=True,
        )
    else:
        console.print(
            f"[red]the replay diverges at version {divergence.version}:[/red] {divergence.difference}; "
            f"records: {out}",
            soft_wrap=True,
            highlight=False,
        )
