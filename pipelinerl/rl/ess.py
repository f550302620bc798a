"""Effective sample size (ESS) of the importance weights of one optimizer step.

Role: the paper's measure of how on-policy the training data is; 1 means every token has the same weight
(e.g. fully on-policy data), values near 0 mean a few tokens dominate.

Invariants: computed over the N masked-in tokens only; the result lies in (0, 1] (Cauchy-Schwarz), and is
invariant to scaling all weights by the same positive number. It is computed in log space
(``ESS = exp(2 LSE(l) - LSE(2 l) - log N)`` with ``l = log w``), so no weight, however large, overflows its
square: a ratio pi/mu of 1e200, or one that overflowed float32 to ``inf``, is a valid input. An infinite
weight gives the limit of the formula, ``k / N`` for ``k`` infinite weights (they dominate equally).

Two ESS are logged per step (``workers/step_statistics.py``): ``rl/ess`` of the raw ratios pi/mu and
``rl/ess_truncated`` of the truncated weights min(pi/mu, c) that multiply the advantage in the loss.

Reference: Piché et al. 2025, "PipelineRL", arXiv 2509.19128, §"Numbers to implement" (ESS).
"""

from __future__ import annotations

import math

import torch

from pipelinerl.rl.masks import check_token_mask


def _masked(values: torch.Tensor, token_mask: torch.Tensor | None, name: str) -> torch.Tensor:
    """The masked-in entries of ``values`` as a flat float64 tensor (float64: sums over millions of tokens
    per step lose precision in float32)."""
    if token_mask is not None:
        check_token_mask(values.shape, token_mask, f"the shape of {name}")
        values = values[token_mask]
    flat = values.detach().reshape(-1).to(torch.float64)
    if flat.numel() == 0:
        raise ValueError("effective_sample_size needs at least one masked-in token, got 0")
    return flat


def effective_sample_size_from_log_weights(
    log_weights: torch.Tensor, token_mask: torch.Tensor | None = None
) -> float:
    """Normalised ESS of the weights ``w = exp(log_weights)``, computed without forming ``w``.

    Args:
        log_weights: ``[*]`` per-token log importance weights, e.g. ``logpi - logmu`` (a ratio's log) or
            ``min(logpi - logmu, log c)`` (a truncated weight's). ``-inf`` is a weight of 0, ``+inf`` an
            infinite weight.
        token_mask: ``[*]`` bool, same shape; only True positions count. ``None`` counts every position.

    Returns:
        ``(sum w)^2 / (N * sum w^2)`` in (0, 1].

    Raises:
        ValueError: shapes differ, no token is masked in, a log weight is NaN, or every weight is 0
            (ESS is undefined).
    """
    logs = _masked(log_weights, token_mask, "log_weights")
    num_tokens = logs.numel()
    if bool(torch.isnan(logs).any()):
        raise ValueError("log_weights contain NaN; the effective sample size is undefined")
    infinite = int(torch.isposinf(logs).sum().item())
    if infinite:  # the limit as those weights grow together: they alone carry the mass
        return infinite / num_tokens
    if bool(torch.isneginf(logs).all()):
        raise ValueError("all importance_weights are 0; the effective sample size is undefined")
    log_ess = 2 * torch.logsumexp(logs, 0) - torch.logsumexp(2 * logs, 0) - math.log(num_tokens)
    # Cauchy-Schwarz bounds ESS by 1; rounding can overshoot it by an ulp when the weights are equal.
    return min(math.exp(float(log_ess.item())), 1.0)


def effective_sample_size(importance_weights: torch.Tensor, token_mask: torch.Tensor | None = None) -> float:
    """Normalised effective sample size ``ESS = (sum w)^2 / (N * sum w^2)``.

    Args:
        importance_weights: ``[*]`` non-negative per-token weights (detached), e.g.
            :attr:`PolicyLossOutput.importance_weights` concatenated over a step's micro-batches. Any
            magnitude, ``inf`` included (see the module docstring).
        token_mask: ``[*]`` bool, same shape; only True positions count. ``None`` counts every position.

    Returns:
        ESS in (0, 1].

    Raises:
        ValueError: shapes differ, no token is masked in, a weight is negative or NaN, or all weights
            are 0 (ESS is undefined).

    Reference: Piché et al. 2025, arXiv 2509.19128, §"Numbers to implement" (ESS).
    """
    weights = _masked(importance_weights, token_mask, "importance_weights")
    if bool(torch.isnan(weights).any()):
        raise ValueError("importance_weights contain NaN; the effective sample size is undefined")
    min_weight = float(weights.min().item())
    if min_weight < 0:
        raise ValueError(f"importance_weights must be non-negative, got a weight of {min_weight}")
    return effective_sample_size_from_log_weights(torch.log(weights))
