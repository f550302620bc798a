"""The pure mapping from each stage's records to a run's MLflow metrics (``step`` is always the policy
version). What each name means, its unit and the derived statistics are in ``metric_registry``; here
only which of a record's keys the tracker logs, under which name."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from pipelinerl.platform.tracking import metric_registry as registry


def logged(record: Mapping[str, Any], owner: registry.Owner) -> dict[str, float]:
    """The keys of ``owner``'s record that the registry says MLflow gets, under their own names."""
    metrics = {}
    for key, value in record.items():
        metric = registry.declaration(key)
        if metric is not None and metric.owner == owner and metric.mlflow and metric.kind == "metric":
            metrics[key] = float(value)
    return metrics


_TRAINER_DERIVED = tuple(m.name for m in registry.METRICS if m.owner == "trainer" and m.derive is not None)


def trainer_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """Metrics of one trainer record (one optimizer step), with its derived statistics (trainer
    tokens/s and idle fraction: ``metric_registry.trainer_tokens_per_s``)."""
    metrics = logged(record, "trainer")
    for name in _TRAINER_DERIVED:
        value = registry.derive(name, record)
        if value is not None:
            metrics[name] = value
    return metrics


def actor_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """One actor record's metrics under the actor's own names (``actor/<k>/...``, see the registry)."""
    actor_id = int(record.get(registry.ACTOR_ID, 0))
    return {registry.per_actor_name(key, actor_id): value for key, value in logged(record, "actor").items()}


def all_actors_metrics(latest: Mapping[int, Mapping[str, Any]]) -> dict[str, float]:
    """The actors together, under the plain names, from each actor's latest record: rates and counts
    summed, fractions and pauses averaged (``metric_registry.ACTOR_AGGREGATES``)."""
    metrics = {}
    for key, how in registry.ACTOR_AGGREGATES.items():
        values = [float(record[key]) for record in latest.values() if key in record]
        if values and (declared := registry.declaration(key)) is not None and declared.mlflow:
            metrics[key] = sum(values) if how == "sum" else statistics.fmean(values)
    return metrics


def preprocessor_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """The rollout queue and the preprocessor's running counts: scored rollouts by label
    (``scores/correct``, ...), samples dropped by reason (``samples/dropped_stale``, ...), refused input
    (``preprocessor/malformed``, ...) and rollouts numbered but never received (``preprocessor/lost``)."""
    return logged(record, "preprocessor")


def eval_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """Metrics of an in-run eval record (``workers/evaluation.py``): ``eval/<set>/pass_at_1``, pass_at_k,
    mean reward and length, and the label counts (``eval/<set>/scores/<label>``). MLflow refuses ``@``
    in a metric name, so the record's ``pass@k`` is logged as ``pass_at_k``."""
    eval_set = record[registry.EVAL_SET]
    metrics = {
        registry.name_of(registry.EVAL_SET_PASS_AT, set=eval_set, k=1): float(
            record[registry.name_of(registry.EVAL_PASS_AT, k=1)]
        ),
        registry.name_of(registry.EVAL_SET_MEAN_REWARD, set=eval_set): float(
            record[registry.EVAL_MEAN_REWARD]
        ),
        registry.name_of(registry.EVAL_SET_MEAN_LENGTH, set=eval_set): float(
            record[registry.EVAL_MEAN_LENGTH]
        ),
    }
    if (k := record[registry.EVAL_SAMPLES]) > 1:
        metrics[registry.name_of(registry.EVAL_SET_PASS_AT, set=eval_set, k=k)] = float(
            record[registry.name_of(registry.EVAL_PASS_AT, k=k)]
        )
    metrics.update(
        {
            registry.name_of(registry.EVAL_SET_SCORES, set=eval_set, label=label): float(count)
            for label, count in record[registry.EVAL_LABELS].items()
        }
    )
    return metrics
