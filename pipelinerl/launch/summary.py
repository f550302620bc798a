"""A run's summary, computed from its per-step records (``metrics.jsonl``). Pure: no I/O here.

Its fields are declared in ``metric_registry`` (``S_*``; MLflow gets the numeric ones as
``summary/<field>``). The trainer's tokens/s and idle fraction over the run (``tokens_per_s``,
``trainer_wait_fraction``) are the registry's per-step statistics over the sums of their inputs, so
they agree with what MLflow and the dashboard show for the steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipelinerl.platform.tracking import metric_registry as registry


def summarize(
    records: Sequence[dict[str, Any]],
    *,
    mode: str,
    eval_success_start: float,
    eval_success_end: float,
    eval_samples: int,
    wall_s: float,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The fields of ``summary.json``; token-weighted means over steps, maxima over the run."""
    records = [registry.canonical_record(r, "trainer") for r in records]
    tokens = sum(r[registry.TRAINER_TOKENS] for r in records)

    def weighted(key: str) -> float:
        return sum(r[key] * r[registry.TRAINER_TOKENS] for r in records) / tokens if tokens else 0.0

    summary = {
        registry.S_MODE: mode,
        registry.S_STEPS: len(records),
        registry.S_FINAL_POLICY_VERSION: records[-1][registry.POLICY_VERSION] if records else 0,
        registry.S_EVAL_SUCCESS_START: eval_success_start,
        registry.S_EVAL_SUCCESS_END: eval_success_end,
        registry.S_EVAL_SUCCESS_GAIN: eval_success_end - eval_success_start,
        registry.S_EVAL_SAMPLES: eval_samples,
        registry.S_ESS_MEAN: sum(r[registry.ESS] for r in records) / len(records) if records else 0.0,
        registry.S_ESS_MIN: min((r[registry.ESS] for r in records), default=0.0),
        registry.S_LAG_MEAN: weighted(registry.LAG_MEAN),
        registry.S_LAG_MAX: max((r[registry.LAG_MAX] for r in records), default=0),
        registry.S_INFLIGHT_SEQUENCES: sum(r[registry.TRAINER_INFLIGHT_SEQUENCES] for r in records),
        registry.S_SAMPLES_TRAINED: sum(r[registry.TRAINER_SAMPLES] for r in records),
        registry.S_TOKENS_TRAINED: tokens,
        registry.S_REWARD_MEAN_FIRST: records[0][registry.REWARD_MEAN] if records else 0.0,
        registry.S_REWARD_MEAN_LAST: records[-1][registry.REWARD_MEAN] if records else 0.0,
        registry.S_TRAINER_WAIT_FRACTION: registry.derive_over(registry.TRAINER_IDLE_FRACTION, records)
        or 0.0,
        registry.S_WALL_S: wall_s,
        registry.S_TOKENS_PER_S: registry.derive_over(registry.TRAINER_TOKENS_PER_S, records) or 0.0,
    }
    summary.update(extra or {})
    return summary
