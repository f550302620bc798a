"""The terminal view of a run: live progress while it trains, a summary table at the end."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipelinerl.platform.config import PipelineConfig


class ProgressView:
    def __init__(self, console: Console, config: PipelineConfig) -> None:
        self.console = console
        self.config = config
        self.status = "starting"
        self.last: dict[str, Any] = {}
        self.last_evals: dict[str, dict[str, Any]] = {}  # by eval set
        self.started = time.time()
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} steps"),
            TimeElapsedColumn(),
            console=console,
        )
        self.task_id = self.progress.add_task(f"{config.run.mode}", total=config.run.max_steps)
        self.live = Live(self._render(), console=console, refresh_per_second=4, transient=False)

    def __enter__(self) -> ProgressView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.update(self._render())
        self.live.__exit__(*exc)  # type: ignore[arg-type]

    def set_status(self, text: str) -> None:
        self.status = text
        self.console.log(text)
        self.live.update(self._render())

    def add_records(self, records: list[dict[str, Any]]) -> None:
        self.last = records[-1]
        self.status = "training"
        self.progress.update(self.task_id, completed=self.last["policy_version"])
        self.live.update(self._render())

    def add_evals(self, records: list[dict[str, Any]]) -> None:
        """In-run evaluations (``eval.every``): the latest is shown beside the training row."""
        for record in records:
            self.last_evals[record.get("set", "")] = record
        self.live.update(self._render())

    def _latest_eval(self) -> str:
        """The latest pass@1 of each eval set, named when there are several."""
        named = len(self.last_evals) > 1
        return (
            " ".join(
                f"{name + ' ' if named else ''}{e['pass@1']:.1%} @v{e['policy_version']}"
                for name, e in self.last_evals.items()
            )
            or "-"
        )

    def _render(self) -> Group:
        table = Table(show_header=True, header_style="bold", box=None)
        columns = (
            "version",
            "reward",
            "ESS",
            "lag mean/max",
            "in-flight seqs",
            "tokens/s",
            "eval pass@1",
            "status",
        )
        for column in columns:
            table.add_column(column)
        r = self.last
        if r:
            tokens_per_s = r["tokens/trained"] / r["wall_s"] if r.get("wall_s") else 0.0
            table.add_row(
                str(r["policy_version"]),
                f"{r['rl/reward_mean']:.3f}",
                f"{r['rl/ess']:.3f}",
                f"{r['lag/mean']:.2f}/{r['lag/max']}",
                str(r["inflight_sequences"]),
                f"{tokens_per_s:.0f}",
                self._latest_eval(),
                self.status,
            )
        else:
            table.add_row("-", "-", "-", "-", "-", "-", self._latest_eval(), self.status)
        return Group(self.progress, table)

    def print_summary(self, summary: dict[str, Any], run_dir: Path) -> None:
        table = Table(title=f"PipelineRL run {summary['run_id']} ({summary['mode']})", show_header=False)
        table.add_column("metric", style="bold")
        table.add_column("value")
        gain = summary["eval_success_end"] - summary["eval_success_start"]
        rows = [
            (
                "held-out success",
                f"{summary['eval_success_start']:.1%} -> {summary['eval_success_end']:.1%} "
                f"({gain:+.1%}, {summary['eval_samples']} problems)",
            ),
            (
                "train reward (first -> last step)",
                f"{summary['reward_mean_first']:.3f} -> {summary['reward_mean_last']:.3f}",
            ),
            (
                "optimizer steps / final policy version",
                f"{summary['steps']} / {summary['final_policy_version']}",
            ),
            ("samples / tokens trained", f"{summary['samples_trained']} / {summary['tokens_trained']}"),
            ("ESS mean (min)", f"{summary['ess_mean']:.3f} ({summary['ess_min']:.3f})"),
            ("token lag mean / max", f"{summary['lag_mean']:.2f} / {summary['lag_max']}"),
            ("sequences written by 2+ versions", str(summary["inflight_sequences"])),
            ("training wall time", f"{summary['wall_s']:.0f} s ({summary['tokens_per_s']:.0f} tokens/s)"),
            ("peak memory (all processes)", f"{summary['peak_memory_gib']:.2f} GiB"),
            ("run directory", str(run_dir)),
        ]
        if (run_dir / "mlflow_run_id").exists():
            from pipelinerl.platform.tracking.mlflow_store import mlflow_uri

            rows.append(
                ("MLflow run", f"{(run_dir / 'mlflow_run_id').read_text()} in {mlflow_uri(self.config)}")
            )
        for name, value in rows:
            table.add_row(name, value)
        self.console.print(table)


def _seconds(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.0f} s"


def print_comparison(console: Console, result: Any) -> None:
    """The comparison table (``launch/compare.py``'s ``ComparisonResult``)."""
    rows = result.rows
    reference = rows[0].label
    table = Table(
        title=f"Comparison {result.comparison_id}: time to a smoothed train reward of {result.target:.3f}"
    )
    for column in (
        "run",
        "time to target",
        "samples to target",
        f"its time / {reference}'s",
        "ESS mean",
        "lag mean / max",
        "held-out success",
        "training wall time",
    ):
        table.add_column(column, justify="left" if column == "run" else "right", no_wrap=True)
    for row in rows:
        table.add_row(
            row.label,
            _seconds(row.time_to_target_s),
            "-" if row.samples_to_target is None else str(row.samples_to_target),
            "-" if row.time_vs_reference is None else f"{row.time_vs_reference:.2f}x",
            f"{row.ess_mean:.3f}",
            f"{row.lag_mean:.2f} / {row.lag_max}",
            f"{row.eval_success_start:.1%} -> {row.eval_success_end:.1%}",
            f"{row.wall_s:.0f} s",
        )
    console.print(table, width=max(console.width, 150))  # a log file gets the full table too
    if result.mlflow_run_id:
        console.print(f"parent MLflow run: {result.mlflow_run_id} (child runs: one per mode)")
