"""Metric names of a run (stable; ``step`` is always the policy version) and the pure mapping from
each stage's records to them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Stable metric names (step = policy version).
METRICS = (
    "rl/loss",
    "rl/reward_mean",
    "rl/ess",
    "rl/ess_truncated",
    "rl/clipped_fraction",
    "rl/behaviour_mismatch",
    "lag/mean",
    "lag/p50",
    "lag/p90",
    "lag/max",
    "completion_len_mean",
    "completion_len_p50",
    "completion_len_p90",
    "completion_len_max",
    "eval/success",
    "throughput/actor_tokens_per_s",
    "throughput/trainer_tokens_per_s",
    "actor/idle_fraction",
    "trainer/idle_fraction",
    "weights/update_pause_ms",
    "weights/broadcast_ms",
    "queue/rollouts",
    "samples/trained",
    "tokens/trained",
    "ledger/duplicates",
    "run/restarts",
    # Refused input, running counts per stage (docs/reliability.md): damaged frames, impossible values.
    "trainer/malformed",
    "trainer/rejected",
    "actor/malformed",
    "preprocessor/malformed",
    "preprocessor/rejected",
    "preprocessor/peer_disconnects",
    "preprocessor/lost",
    "preprocessor/lost_from_actors",
    "preprocessor/unauthenticated",
    "actor/notices_lost",
)
_TRAINER_KEYS = (
    "rl/loss",
    "rl/reward_mean",
    "rl/ess",
    "rl/clipped_fraction",
    "rl/behaviour_mismatch",
    "lag/mean",
    "lag/p50",
    "lag/p90",
    "lag/max",
    "samples/trained",
    "tokens/trained",
    "weights/broadcast_ms",
    "rl/ess_truncated",
    "completion_len_mean",
    "completion_len_p50",
    "completion_len_p90",
    "completion_len_max",
    "trainer/malformed",
    "trainer/rejected",
)
_ACTOR_KEYS = (
    "throughput/actor_tokens_per_s",
    "actor/idle_fraction",
    "weights/update_pause_ms",
    "actor/malformed",
    "actor/notices_lost",
)
_PREPROCESSOR_COUNTS = (
    "preprocessor/malformed",
    "preprocessor/rejected",
    "preprocessor/peer_disconnects",
    "preprocessor/lost",
    "preprocessor/lost_from_actors",
    "preprocessor/unauthenticated",
)


# ----- pure mapping from stage records to metrics -----


def trainer_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """Stable metrics of one trainer record (one optimizer step)."""
    metrics = {key: float(record[key]) for key in _TRAINER_KEYS if key in record}
    busy = float(record["trainer/step_s"]) + float(record.get("weights/broadcast_ms", 0.0)) / 1000
    total = busy + float(record["trainer/wait_s"])
    metrics["trainer/idle_fraction"] = float(record["trainer/wait_s"]) / total if total > 0 else 0.0
    metrics["throughput/trainer_tokens_per_s"] = float(record["tokens"]) / total if total > 0 else 0.0
    return metrics


def actor_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """Stable metrics of one actor record (one loaded weight update); actors > 0 get a prefix."""
    actor_id = int(record.get("actor_id", 0))
    prefix = "" if actor_id == 0 else f"actor{actor_id}:"
    return {prefix + key: float(record[key]) for key in _ACTOR_KEYS if key in record}


def preprocessor_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """The rollout queue, the running counts of scored rollouts by label (``scores/correct``, ...), of
    samples dropped (``samples/dropped_stale``, ``samples/dropped_zero_variance``, ...) and of refused
    input (``preprocessor/malformed``, ``preprocessor/rejected``, ``preprocessor/peer_disconnects``) and
    of rollouts numbered but never received (``preprocessor/lost``; of them, the run's actors'
    ``preprocessor/lost_from_actors``)."""
    metrics = {"queue/rollouts": float(record["queue/rollouts"])}
    metrics.update({key: float(record[key]) for key in _PREPROCESSOR_COUNTS if key in record})
    metrics.update(
        {
            key: float(value)
            for key, value in record.items()
            if key.startswith(("scores/", "samples/dropped_"))
        }
    )
    return metrics


def eval_metrics(record: dict[str, Any]) -> dict[str, float]:
    """Metrics of an in-run eval record (``workers/evaluation.py``): ``eval/<set>/pass_at_1``, pass_at_k,
    mean reward and length, and the label counts. MLflow refuses ``@`` in a metric name, so the
    record's ``pass@k`` is logged as ``pass_at_k``."""
    prefix = f"eval/{record['set']}/"
    metrics = {
        prefix + "pass_at_1": float(record["pass@1"]),
        prefix + "mean_reward": float(record["mean_reward"]),
        prefix + "mean_length": float(record["mean_length"]),
    }
    if (k := record["samples"]) > 1:
        metrics[prefix + f"pass_at_{k}"] = float(record[f"pass@{k}"])
    metrics.update({prefix + label: float(count) for label, count in record["labels"].items()})
    return metrics
