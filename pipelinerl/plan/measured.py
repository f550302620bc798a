"""A finished run beside its prediction: what its records measured, in the simulator's terms.

``measured(run_dir)`` reads the figures the simulator predicts from a run's records: samples/s and the
trainer's idle share from the end of its first step on (the stages start at different times, so the
first step's wait is not the pipeline's), the actors' idle share and the lag of every trained token over
all its steps. ``predicted_beside_measured`` simulates the run's own config under a profile with the
run's own completion lengths (the simulator takes lengths as an input; the run's are the best there
is), and returns both with their differences: what ``run.plan_profile`` writes to
``plan_prediction.json`` and logs to MLflow, and what the dashboard's run page shows.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipelinerl.plan.calibrate import completion_lengths
from pipelinerl.plan.from_config import bucket_bytes_of, workload_from_config
from pipelinerl.plan.profile import resolve_profile
from pipelinerl.plan.simulate import SimulatedRun, simulate
from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.tracking import metric_registry as registry

PREDICTION_FILE = "plan_prediction.json"
# The measured figure, and the predicted one it is compared with.
COMPARED: dict[str, str] = {
    "steady_samples_per_s": "steady_samples_per_s",
    "trainer_idle": "steady_trainer_idle",
    "actor_idle": "actor_idle",
    "lag_mean": "lag_mean",
    "lag_max": "lag_max",
}


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def measured(run_dir: Path) -> dict[str, float]:
    """What the run's records say (the module's docstring says over which span); a run of fewer than two
    steps has no span after its first step: ``ValueError`` naming the run."""
    steps = _records(run_dir / "metrics.jsonl")
    if len(steps) < 2:
        raise ValueError(f"{run_dir}: {len(steps)} trainer steps recorded; a comparison needs 2 or more")
    span = steps[-1][registry.TIME] - steps[0][registry.TIME]
    histogram = [0] * max(len(s[registry.LAG_HISTOGRAM]) for s in steps)
    for step in steps:
        for lag, count in enumerate(step[registry.LAG_HISTOGRAM]):
            histogram[lag] += count
    tokens = sum(histogram)
    actors = [
        r
        for path in run_dir.glob("actor*.jsonl")
        for r in _records(path)
        if registry.ACTOR_IDLE_FRACTION in r
    ]
    return {
        "steady_samples_per_s": sum(s[registry.TRAINER_SAMPLES] for s in steps[1:]) / span if span else 0.0,
        "trainer_idle": sum(s[registry.TRAINER_WAIT_S] for s in steps[1:]) / span if span else 0.0,
        "actor_idle": sum(r[registry.ACTOR_IDLE_FRACTION] for r in actors) / len(actors) if actors else 0.0,
        "lag_mean": sum(lag * n for lag, n in enumerate(histogram)) / tokens if tokens else 0.0,
        "lag_max": max((lag for lag, n in enumerate(histogram) if n), default=0),
    }


def predicted_beside_measured(
    config: PipelineConfig, run_dir: Path, profile: str, prompt_tokens: int
) -> dict[str, Any]:
    """The run ``config`` describes, simulated under ``profile`` with the run's completion lengths, beside
    what ``run_dir``'s records measured (``PREDICTION_FILE``'s content)."""
    chosen = resolve_profile(profile)
    workload = workload_from_config(config, completion_lengths([run_dir]), prompt_tokens)
    run: SimulatedRun = simulate(workload, chosen.cost_model(bucket_bytes_of(config)), config.run.seed)
    predicted = asdict(run)
    seen = measured(run_dir)
    return {
        "profile": chosen.name,
        "lengths": f"run:{run_dir.name}",
        "mode": workload.mode,
        "prompt_tokens": prompt_tokens,
        "predicted": predicted,
        "measured": seen,
        "difference": {name: predicted[COMPARED[name]] - value for name, value in seen.items()},
    }


def plan_metrics(prediction: dict[str, Any]) -> dict[str, float]:
    """The MLflow metrics of a prediction: ``plan/predicted/<figure>`` and ``plan/measured/<figure>``."""
    metrics: dict[str, float] = {}
    for name, value in prediction["measured"].items():
        metrics[registry.name_of(registry.PLAN, side="measured", figure=name)] = float(value)
        predicted = prediction["predicted"][COMPARED[name]]
        metrics[registry.name_of(registry.PLAN, side="predicted", figure=name)] = float(predicted)
    return metrics
