"""A trainer step's statistics, the bulk of its ``metrics.jsonl`` record, from what every rank of the
step gathered (``RankStep``, one per rank). Pure: the trainer adds its own counters and timings.

Every figure is over the whole step (all ranks' tokens and sequences); the formulas are ``rl/``'s
(ESS, lag, behaviour mismatch) and ``recipe_terms.recipe_metrics``; the names, ``metric_registry``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.rl.ess import effective_sample_size_from_log_weights
from pipelinerl.rl.lag import lag_statistics, token_lags
from pipelinerl.rl.mismatch import behaviour_mismatch
from pipelinerl.workers.policy_step import TokenRecord, concat_records
from pipelinerl.workers.recipe_terms import recipe_metrics

logger = logging.getLogger("pipelinerl.trainer")

# A micro-batch's (tokens, clipped, clipped low, clipped high, KL mean, entropy mean): recipe_metrics's input.
MicroBatchResult = tuple[int, float, float, float, float | None, float | None]


class RankStep(NamedTuple):
    """What one rank trained in a step, gathered by every rank."""

    tokens: TokenRecord  # per token: versions, positions, log-probs, ratios
    rewards: list[float]  # per sequence
    version_spans: list[int]  # per sequence: how many policy versions wrote it
    lengths: list[int]  # per sequence: completion tokens
    loss: float  # the sum of the rank's micro-batch losses
    rollouts: list[tuple[str, int]]  # (rollout id, the oldest version that wrote it)
    results: list[MicroBatchResult]
    groups: list[str]  # the train groups it trained


def version_span(token_versions: Any) -> int:
    """How many policy versions wrote a sequence (2+: it was in flight during an update)."""
    return len(np.unique(np.asarray(token_versions)))


def ess_metrics(
    trainer_logprobs: np.ndarray, behaviour_logprobs: np.ndarray, is_cap: float | None
) -> dict[str, float]:
    """The step's two effective sample sizes, from log-probs (log space: no ratio overflows).

    ``rl/ess``: of the raw ratios pi/mu; ``rl/ess_truncated``: of the truncated weights min(pi/mu, c) that
    multiply the advantage in the truncated-IS loss (``is_cap`` = c; None for a loss without them). A
    statistic that is undefined (a NaN log-prob) is left out and logged, never fatal."""
    log_ratio = torch.from_numpy(trainer_logprobs.astype(np.float64) - behaviour_logprobs.astype(np.float64))
    logs = {registry.ESS: log_ratio}
    if is_cap is not None:
        logs[registry.ESS_TRUNCATED] = torch.clamp(log_ratio, max=float(np.log(is_cap)))
    metrics = {}
    for name, log_weights in logs.items():
        try:
            metrics[name] = effective_sample_size_from_log_weights(log_weights)
        except ValueError as error:
            logger.warning("%s left out of this step: %s", name, error)
    return metrics


def step_statistics(
    parts: Sequence[RankStep], trained_at: int, is_cap: float | None, kl_coef: float, entropy_coef: float
) -> dict[str, Any]:
    """The step's statistics from every rank's part; ``trained_at`` is the version the step trained
    (lag is counted from it), ``is_cap`` the truncated-IS cap (None for a loss without one)."""
    tokens = concat_records([part.tokens for part in parts])
    rewards = np.array([reward for part in parts for reward in part.rewards], dtype=np.float64)
    spans = [span for part in parts for span in part.version_spans]
    lengths = [length for part in parts for length in part.lengths]
    lags = token_lags(trained_at, torch.from_numpy(tokens.token_versions.astype(np.int64)))
    lag = lag_statistics(lags, torch.from_numpy(tokens.token_positions.astype(np.int64)))
    statistics: dict[str, Any] = {
        registry.LOSS: float(np.mean([part.loss for part in parts])),
        registry.REWARD_MEAN: float(rewards.mean()),
        **ess_metrics(tokens.trainer_logprobs, tokens.behaviour_logprobs, is_cap),
        **recipe_metrics([result for part in parts for result in part.results], kl_coef, entropy_coef),
        registry.LAG_MEAN: lag.mean,
        registry.LAG_P50: lag.p50,
        registry.LAG_P90: lag.p90,
        registry.LAG_MAX: lag.max,
        registry.LAG_HISTOGRAM: lag.histogram,
        registry.LAG_BY_POSITION: lag.mean_by_position,
        registry.LAG_POSITION_BUCKET_SIZE: lag.position_bucket_size,
        registry.TRAINER_SAMPLES: len(rewards),
        registry.TRAINER_TOKENS: len(tokens.ratio),
        registry.TRAINER_INFLIGHT_SEQUENCES: sum(1 for span in spans if span > 1),
        registry.COMPLETION_LEN_MEAN: float(np.mean(lengths)),
        # The step's completion-length distribution (long tails are what in-flight updates win on).
        registry.COMPLETION_LEN_P50: float(np.percentile(lengths, 50)),
        registry.COMPLETION_LEN_P90: float(np.percentile(lengths, 90)),
        registry.COMPLETION_LEN_MAX: int(np.max(lengths)),
        # (rollout id, oldest version that wrote it): the tracking owner fills the rollout ledger.
        registry.ROLLOUTS: [list(entry) for part in parts for entry in part.rollouts],
        # The groups trained (a group's members may sit on several ranks): the prompt ledger.
        registry.TRAINED_GROUPS: sorted({group for part in parts for group in part.groups}),
    }
    mismatch = behaviour_mismatch(
        torch.from_numpy(tokens.trainer_logprobs), torch.from_numpy(tokens.behaviour_logprobs), lags
    )
    if mismatch is not None:  # absent, not NaN, in a step without a lag-0 token (JSON has no NaN)
        statistics[registry.BEHAVIOUR_MISMATCH] = mismatch
    return statistics
