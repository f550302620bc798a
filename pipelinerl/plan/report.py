"""A plan as data: what was asked (profile, cluster, lengths, modes, sweep) and what was predicted.

One shape for ``pipelinerl plan --json``, the ``plan`` flow's result and the plans the dashboard's Plan
page draws: ``make_plan`` computes it (a sweep or not; ``Plan.to_json`` is the data), ``save_plan``
writes it under the platform home (``<home>/plans/<created>-<name>.json``), ``saved_plans`` lists them,
newest first.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipelinerl.plan.cluster import Cluster, parse_cluster
from pipelinerl.plan.lengths import Lengths
from pipelinerl.plan.predict import SweepPoint, parse_sweep, predict, recommend, sweep_points
from pipelinerl.plan.profile import resolve_profile
from pipelinerl.plan.simulate import SimulatedRun
from pipelinerl.platform.config import PipelineConfig, with_overrides

PLANS_DIR = "plans"


@dataclass
class Plan:
    """What was asked, and either the predicted runs (by mode) or the sweep's points and its best one."""

    asked: dict[str, Any]
    runs: dict[str, SimulatedRun] = field(default_factory=dict)
    swept: str | None = None
    points: list[SweepPoint] = field(default_factory=list)
    best: SweepPoint | None = None
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        if self.best is None:
            return {"asked": self.asked, "runs": runs_json(self.runs), "speedups": speedups(self.runs)}
        return {
            "asked": self.asked,
            "swept": self.swept,
            "recommended": self.best.value,
            "reason": self.reason,
            "points": [point_json(point) for point in self.points],
        }


def make_plan(
    config: PipelineConfig,
    profile: str,
    lengths: Lengths,
    lengths_text: str,
    modes: list[str],
    prompt_tokens: int = 100,
    cluster: str | None = None,
    sweep: str | None = None,
    seed: int = 0,
    on_point: Callable[[SweepPoint], None] | None = None,
) -> Plan:
    """Predict ``config`` (in each mode, on ``cluster``; across ``sweep`` when given). Bad input raises
    ``ValueError`` (``ProfileError``, ``ClusterError``, ``ConfigError``) naming it, before simulating."""
    chosen = resolve_profile(profile)
    planned = parse_cluster(cluster) if cluster else None
    asked: dict[str, Any] = {
        "profile": chosen.name,
        "cluster": str(planned) if planned else None,
        "lengths": lengths_text,
        "modes": modes,
        "prompt_tokens": prompt_tokens,
        "sweep": sweep,
        "seed": seed,
        "max_in_flight": config.actor.max_in_flight,
    }
    if sweep is None:
        return Plan(asked, runs=predict(config, chosen, lengths, modes, prompt_tokens, planned, seed))
    axis = parse_sweep(sweep)
    if axis.name != "actor_gpus":  # every value checked before the first is simulated
        configs = {value: with_overrides(config, {axis.name: value}) for value in axis.values}

    def config_for(value: int | None) -> PipelineConfig:
        return config if value is None else configs[value]

    points = []
    for point in sweep_points(axis, config_for, chosen, lengths, modes, prompt_tokens, planned, seed):
        points.append(point)
        if on_point is not None:
            on_point(point)
    best, reason = recommend(points, modes[0], axis.name)
    return Plan(asked, swept=axis.name, points=points, best=best, reason=reason)


def runs_json(runs: dict[str, SimulatedRun]) -> dict[str, dict[str, Any]]:
    return {mode: asdict(run) for mode, run in runs.items()}


def point_json(point: SweepPoint) -> dict[str, Any]:
    return {
        "value": point.value,
        "cluster": str(point.cluster) if point.cluster else None,
        "runs": runs_json(point.runs),
    }


def speedups(runs: dict[str, SimulatedRun]) -> dict[str, float]:
    """The first mode's samples/s over each other mode's (the same samples: also its time ratio)."""
    first, *others = list(runs)
    return {
        other: runs[first].samples_per_s / runs[other].samples_per_s
        for other in others
        if runs[other].samples_per_s > 0
    }


def save_plan(home: Path, plan: dict[str, Any], name: str = "plan") -> Path:
    """Write ``plan`` under ``home``/plans; returns its path."""
    directory = home.expanduser() / PLANS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    created = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path = directory / f"{created}-{name}.json"
    serial = 1
    while path.exists():
        serial += 1
        path = directory / f"{created}-{name}-{serial}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"created": created, "name": name, **plan}, indent=2))
    tmp.replace(path)
    return path


def saved_plans(home: Path) -> list[Path]:
    """The plans saved under ``home``, newest first."""
    return sorted((home.expanduser() / PLANS_DIR).glob("*.json"), reverse=True)


def cluster_of(plan: dict[str, Any]) -> Cluster | None:
    text = plan.get("asked", {}).get("cluster")
    return parse_cluster(text) if text else None
