"""A run's summary, computed from its per-step records (``metrics.jsonl``). Pure: no I/O here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
    tokens = sum(r["tokens"] for r in records)
    weighted = (
        (lambda key: sum(r[key] * r["tokens"] for r in records) / tokens) if tokens else (lambda key: 0.0)
    )
    summary = {
        "mode": mode,
        "steps": len(records),
        "final_policy_version": records[-1]["policy_version"] if records else 0,
        "eval_success_start": eval_success_start,
        "eval_success_end": eval_success_end,
        "eval_success_gain": eval_success_end - eval_success_start,
        "eval_samples": eval_samples,
        "ess_mean": sum(r["rl/ess"] for r in records) / len(records) if records else 0.0,
        "ess_min": min((r["rl/ess"] for r in records), default=0.0),
        "lag_mean": weighted("lag/mean"),
        "lag_max": max((r["lag/max"] for r in records), default=0),
        "inflight_sequences": sum(r["inflight_sequences"] for r in records),
        "samples_trained": sum(r["samples"] for r in records),
        "tokens_trained": tokens,
        "reward_mean_first": records[0]["rl/reward_mean"] if records else 0.0,
        "reward_mean_last": records[-1]["rl/reward_mean"] if records else 0.0,
        "trainer_wait_fraction": (sum(r["trainer/wait_s"] for r in records) / wall_s) if wall_s else 0.0,
        "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s else 0.0,
    }
    summary.update(extra or {})
    return summary
