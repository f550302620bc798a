"""Sweeps: a grid (or list) of config overrides, each point a child run under one parent run.

``expand_grid`` and ``sweep_points`` are pure; ``run_sweep`` launches the points, at most
``max_concurrency`` at a time (threads, each running ``launch``; concurrent points get their own
block of ports), under one parent MLflow run that receives the overlay figure and the table.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import re
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pipelinerl.launch.launcher import RunResult, launch
from pipelinerl.platform.config import PORTS, ConfigError, PipelineConfig, with_overrides
from pipelinerl.platform.tracking import figures
from pipelinerl.platform.tracking.parent_run import ParentRun, parent_run

PORT_BLOCK = 20  # ports reserved per concurrent point (PORTS plus trainer inboxes)


@dataclass(frozen=True)
class SweepPoint:
    label: str
    overrides: dict[str, Any]


def expand_grid(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, keys in the given order: ``{"a": [1, 2]}`` -> 2 points."""
    for key, values in grid.items():
        if isinstance(values, str | bytes) or not isinstance(values, Sequence) or not values:
            raise ConfigError(f"sweep grid {key!r}: give a non-empty list of values, got {values!r}")
    keys = list(grid)
    return [dict(zip(keys, combination, strict=True)) for combination in itertools.product(*grid.values())]


def metric_safe(label: str) -> str:
    """MLflow metric names allow letters, digits and ``_-. :/`` only."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", label)


def point_label(overrides: Mapping[str, Any]) -> str:
    return ",".join(f"{key.split('.')[-1]}={value}" for key, value in overrides.items()) or "base"


def sweep_points(config: PipelineConfig, overrides: Sequence[Mapping[str, Any]]) -> list[SweepPoint]:
    """Validate every point against the config before anything runs (a bad value names its point)."""
    points = []
    for values in overrides:
        label = point_label(values)
        try:
            with_overrides(config, dict(values))
        except ConfigError as error:
            raise ConfigError(f"sweep point {label}: {error}") from None
        points.append(SweepPoint(label, dict(values)))
    if len({p.label for p in points}) != len(points):
        raise ConfigError("sweep points must differ: two points have the same overrides")
    return points


def point_config(config: PipelineConfig, point: SweepPoint, slot: int) -> PipelineConfig:
    """The point's config; concurrent slots get disjoint port blocks."""
    base_port = config.transport.base_port + slot * PORT_BLOCK
    if len(PORTS) + config.trainer.num_processes > PORT_BLOCK:
        raise ConfigError("trainer.num_processes is too large for a sweep's port block")
    return with_overrides(config, {**point.overrides, "transport.base_port": base_port})


class PortSlots:
    """The sweep's blocks of ports: a point takes a free one when it starts and gives it back when it
    ends, so two points running at once never share one, however their durations differ (a slot per
    point index would give a point the block of a longer one still running)."""

    def __init__(self, count: int) -> None:
        self._free: queue.Queue[int] = queue.Queue()
        for slot in range(count):
            self._free.put(slot)

    @contextlib.contextmanager
    def taken(self) -> Iterator[int]:
        slot = self._free.get()
        try:
            yield slot
        finally:
            self._free.put(slot)


@dataclass
class SweepResult:
    sweep_id: str
    points: list[SweepPoint]
    results: dict[str, RunResult]
    mlflow_run_id: str | None


def run_sweep(
    config: PipelineConfig,
    overrides: Sequence[Mapping[str, Any]],
    *,
    max_concurrency: int = 1,
    on_status: Callable[[str], None] | None = None,
    prefect_flow_run_id: str | None = None,
) -> SweepResult:
    if max_concurrency < 1:
        raise ConfigError(f"max_concurrency must be >= 1, got {max_concurrency}")
    status = on_status or (lambda text: None)
    points = sweep_points(config, overrides)
    sweep_id = f"{datetime.now():%Y%m%d-%H%M%S}-sweep-{uuid.uuid4().hex[:6]}"
    with parent_run(config, sweep_id, "sweep", {"points": str(len(points))}, prefect_flow_run_id) as parent:
        results = _run_points(config, points, sweep_id, max_concurrency, status, parent, prefect_flow_run_id)
        if parent is not None:
            _log_sweep(parent, points, results)
        return SweepResult(sweep_id, points, results, parent.mlflow_run_id if parent else None)


def _run_points(
    config: PipelineConfig,
    points: list[SweepPoint],
    sweep_id: str,
    max_concurrency: int,
    status: Callable[[str], None],
    parent: ParentRun | None,
    prefect_flow_run_id: str | None,
) -> dict[str, RunResult]:
    """Every point's run, at most ``max_concurrency`` at a time, each in its own block of ports."""
    slots = PortSlots(max_concurrency)

    def run_point(index: int, point: SweepPoint) -> RunResult:
        with slots.taken() as slot:
            point_cfg = point_config(config, point, slot)
            status(f"[{point.label}] starting (ports from {point_cfg.transport.base_port})")
            return launch(
                point_cfg,
                run_id=f"{sweep_id}-{index:03d}",
                on_status=lambda text: status(f"[{point.label}] {text}"),
                parent_mlflow_run_id=parent.mlflow_run_id if parent else None,
                parent_run_id=sweep_id if parent else None,
                prefect_flow_run_id=prefect_flow_run_id,
            )

    results: dict[str, RunResult] = {}
    with ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="sweep") as pool:
        futures = [pool.submit(run_point, index, point) for index, point in enumerate(points)]
        for point, future in zip(points, futures, strict=True):
            results[point.label] = future.result()
    return results


def _log_sweep(parent: ParentRun, points: list[SweepPoint], results: dict[str, RunResult]) -> None:
    parent.log_figure(
        figures.comparison(
            {label: r.records for label, r in results.items()}, title=f"Sweep {parent.run_id}"
        ),
        "figures/sweep.png",
    )
    rows = []
    metrics: dict[str, float] = {}
    for point in points:
        summary = results[point.label].summary
        row = {"label": point.label, "overrides": point.overrides, "run_id": summary["run_id"]}
        for key in ("eval_success_start", "eval_success_end", "ess_mean", "lag_mean", "lag_max", "wall_s"):
            row[key] = summary[key]
            metrics[f"{metric_safe(point.label)}/{key}"] = float(summary[key])
        rows.append(row)
    parent.log_table({"points": rows}, "sweep.json", metrics)
