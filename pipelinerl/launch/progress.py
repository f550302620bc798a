"""The terminal view of a run: live progress while it trains, a summary table at the end."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.tracking.mlflow_store import mlflow_uri
from pipelinerl.platform.tracking.ratios import (
    TIMES_FASTER_MEANING,
    times_faster_heading,
    times_faster_text,
)

PASS_AT_1 = registry.name_of(registry.EVAL_PASS_AT, k=1)


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

    def add_records(self, records: Sequence[dict[str, Any]]) -> None:
        self.last = records[-1]
        self.status = "training"
        self.progress.update(self.task_id, completed=self.last[registry.POLICY_VERSION])
        self.live.update(self._render())

    def add_evals(self, records: Sequence[dict[str, Any]]) -> None:
        """In-run evaluations (``eval.every``): the latest is shown beside the training row."""
        for record in records:
            self.last_evals[record.get(registry.EVAL_SET, "")] = record
        self.live.update(self._render())

    def _latest_eval(self) -> str:
        """The latest pass@1 of each eval set, named when there are several."""
        named = len(self.last_evals) > 1
        return (
            " ".join(
                f"{name + ' ' if named else ''}{e[PASS_AT_1]:.1%} @v{e[registry.POLICY_VERSION]}"
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
            "trainer tokens/s",
            "eval pass@1",
            "status",
        )
        for column in columns:
            table.add_column(column)
        r = self.last
        if r:
            # The step's, as MLflow and the dashboard show it (metric_registry.trainer_tokens_per_s).
            tokens_per_s = registry.derive(registry.TRAINER_TOKENS_PER_S, r)
            table.add_row(
                str(r[registry.POLICY_VERSION]),
                f"{r[registry.REWARD_MEAN]:.3f}",
                f"{r[registry.ESS]:.3f}",
                f"{r[registry.LAG_MEAN]:.2f}/{r[registry.LAG_MAX]}",
                str(r[registry.TRAINER_INFLIGHT_SEQUENCES]),
                "-" if tokens_per_s is None else f"{tokens_per_s:.0f}",
                self._latest_eval(),
                self.status,
            )
        else:
            table.add_row("-", "-", "-", "-", "-", "-", self._latest_eval(), self.status)
        return Group(self.progress, table)

    def print_summary(self, summary: dict[str, Any], run_dir: Path) -> None:
        table = Table(
            title=f"PipelineRL run {summary[registry.S_RUN_ID]} ({summary[registry.S_MODE]})",
            show_header=False,
        )
        table.add_column("metric", style="bold")
        table.add_column("value")
        gain = summary[registry.S_EVAL_SUCCESS_END] - summary[registry.S_EVAL_SUCCESS_START]
        rows = [
            (
                "held-out success",
                f"{summary[registry.S_EVAL_SUCCESS_START]:.1%} -> {summary[registry.S_EVAL_SUCCESS_END]:.1%} "
                f"({gain:+.1%}, {summary[registry.S_EVAL_SAMPLES]} problems)",
            ),
            (
                "train reward (first -> last step)",
                f"{summary[registry.S_REWARD_MEAN_FIRST]:.3f} -> {summary[registry.S_REWARD_MEAN_LAST]:.3f}",
            ),
            (
                "optimizer steps / final policy version",
                f"{summary[registry.S_STEPS]} / {summary[registry.S_FINAL_POLICY_VERSION]}",
            ),
            (
                "samples / tokens trained",
                f"{summary[registry.S_SAMPLES_TRAINED]} / {summary[registry.S_TOKENS_TRAINED]}",
            ),
            ("ESS mean (min)", f"{summary[registry.S_ESS_MEAN]:.3f} ({summary[registry.S_ESS_MIN]:.3f})"),
            ("token lag mean / max", f"{summary[registry.S_LAG_MEAN]:.2f} / {summary[registry.S_LAG_MAX]}"),
            ("sequences written by 2+ versions", str(summary[registry.S_INFLIGHT_SEQUENCES])),
            (
                "training wall time",
                f"{summary[registry.S_WALL_S]:.0f} s ({summary[registry.S_TOKENS_PER_S]:.0f} tokens/s)",
            ),
            ("peak memory (all processes)", f"{summary[registry.S_PEAK_MEMORY_GIB]:.2f} GiB"),
            ("run directory", str(run_dir)),
        ]
        if (run_dir / "mlflow_run_id").exists():
            rows.append(
                ("MLflow run", f"{(run_dir / 'mlflow_run_id').read_text()} in {mlflow_uri(self.config)}")
            )
        for name, value in rows:
            table.add_row(name, value)
        self.console.print(table)


def _seconds(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.0f} s"


def print_comparison(console: Console, result: Any) -> None:
    """The comparison table (``launch/compare.py``'s ``ComparisonResult``): one ``× faster than B``
    column per baseline B (``platform/tracking/ratios.py``: B's time ÷ the row's). Every column is kept:
    where the table does not fit the console's width unwrapped (a narrow terminal, a log file's 80
    columns) each run is printed as a block of its own, one line a column, rather than cutting columns
    or folding their words."""
    rows = result.rows
    baselines = list(rows[0].times_faster_than) if rows else []
    headings = [
        "run",
        "time to target",
        "samples to target",
        *(times_faster_heading(baseline) for baseline in baselines),
        "ESS mean",
        "lag mean / max",
        "held-out success",
        "training wall time",
    ]
    cells = [
        [
            row.label,
            _seconds(row.time_to_target_s),
            "-" if row.samples_to_target is None else str(row.samples_to_target),
            *(times_faster_text(row.times_faster_than[baseline]) for baseline in baselines),
            f"{row.ess_mean:.3f}",
            f"{row.lag_mean:.2f} / {row.lag_max}",
            f"{row.eval_success_start:.1%} -> {row.eval_success_end:.1%}",
            f"{row.wall_s:.0f} s",
        ]
        for row in rows
    ]
    title = f"Comparison {result.comparison_id}: time to a smoothed train reward of {result.target:.3f}"
    table = Table(title=title, caption=TIMES_FASTER_MEANING)
    for heading in headings:
        table.add_column(heading, justify="left" if heading == "run" else "right", overflow="fold")
    for row_cells in cells:
        table.add_row(*row_cells)
    natural = console.measure(table, options=console.options.update_width(10_000)).maximum
    if natural <= console.width:
        console.print(table)
    else:  # too narrow for the columns side by side: one block per run
        console.print(title, highlight=False)
        for row_cells in cells:
            block = Table(show_header=False, title=row_cells[0], title_justify="left", box=None)
            block.add_column(overflow="fold")
            block.add_column(overflow="fold")
            for heading, cell in zip(headings[1:], row_cells[1:], strict=True):
                block.add_row(heading, cell)
            console.print(block)
        console.print(TIMES_FASTER_MEANING, highlight=False)
    if result.mlflow_run_id:
        console.print(f"parent MLflow run: {result.mlflow_run_id} (child runs: one per mode)")
