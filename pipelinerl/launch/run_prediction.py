"""``run.plan_profile``: a run predicted by the simulator, beside what it measured.

``check_plan_profile`` (pre-flight) fails a run whose profile cannot be read before anything starts;
``record_prediction`` (at the run's end) simulates the run's own config with its own completion lengths
(``plan/measured.py``) and writes the prediction beside the measured figures to ``plan_prediction.json``
and, for a tracked run, to MLflow (``plan/predicted/...``, ``plan/measured/...``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipelinerl.plan.calibrate import CalibrationError
from pipelinerl.plan.measured import PREDICTION_FILE, plan_metrics, predicted_beside_measured
from pipelinerl.plan.profile import ProfileError, resolve_profile
from pipelinerl.platform.config import ConfigError, PipelineConfig


def check_plan_profile(config: PipelineConfig) -> None:
    """``ConfigError`` naming ``run.plan_profile`` when it is set and cannot be read."""
    if config.run.plan_profile is None:
        return
    try:
        resolve_profile(config.run.plan_profile)
    except ProfileError as error:
        raise ConfigError(f"run.plan_profile={config.run.plan_profile!r}: {error}") from None


def record_prediction(
    config: PipelineConfig, run_dir: Path, tracker: Any, records: Sequence[dict[str, Any]]
) -> None:
    """The prediction beside the measured figures, in the run directory and (``tracker``, when the run
    is tracked) MLflow. A run too short to compare says so in the file rather than failing: the run
    itself succeeded."""
    if config.run.plan_profile is None:
        return
    try:
        prediction = predicted_beside_measured(
            config, run_dir, config.run.plan_profile, config.run.plan_prompt_tokens
        )
    except (ValueError, CalibrationError) as error:
        (run_dir / PREDICTION_FILE).write_text(json.dumps({"error": str(error)}, indent=2))
        return
    (run_dir / PREDICTION_FILE).write_text(json.dumps(prediction, indent=2))
    if tracker is not None:
        version = records[-1]["policy_version"] if records else 0
        tracker.predicted(prediction, plan_metrics(prediction), version)
