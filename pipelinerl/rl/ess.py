"""Effective sample size (ESS) of the importance weights of one optimizer step.

Role: the paper's measure of how on-policy the training data is; 1 means every token has the same weight
(e.g. fully on-policy data), values near 0 mean a few tokens dominate.

Invariants: computed over the N masked-in tokens only; the result lies in (0, 1] (Cauchy-Schwarz), and is
invariant to scaling all weights by the same positive number.

Reference: Piché et al. 2025, "PipelineRL", arXiv 2509.19128, §"Numbers to implement" (ESS).
"""

from __future__ import annotations

import torch


def effective_sample_size(importance_weights: torch.Tensor, token_mask: torch.Tensor | None = None) -> float:
    """Normalised effective sample size ``ESS = (sum w)^2 / (N * sum w^2)``.

    Args:
        importance_weights: ``[*]`` non-negative, finite per-token weights (detached), e.g.
            :attr:`PolicyLossOutput.importance_weights` concatenated over a step's micro-batches.
        token_mask: ``[*]`` bool, same shape; only True positions count. ``None`` counts every position.

    Returns:
        ESS in (0, 1].

    Raises:
        ValueError: shapes differ, no token is masked in, a weight is negative or non-finite, or all weights
            are 0 (ESS is undefined).

    Reference: Piché et al. 2025, arXiv 2509.19128, §"Numbers to implement" (ESS).
    """
    if token_mask is not None:
        if token_mask.shape != importance_weights.shape:
            raise ValueError(
                f"token_mask has shape {tuple(token_mask.shape)}, "
                f"expected the shape of importance_weights {tuple(importance_weights.shape)}"
            )
        if token_mask.dtype != torch.bool:
            raise ValueError(f"token_mask must be a bool tensor, got dtype {token_mask.dtype}")
        weights = importance_weights[token_mask]
    else:
        weights = importance_weights.reshape(-1)
    num_tokens = weights.numel()
    if num_tokens == 0:
        raise ValueError("effective_sample_size needs at least one masked-in token, got 0")

    # float64: sums over millions of tokens per step lose precision in float32.
    weights = weights.detach().to(torch.float64)
    if not bool(torch.isfinite(weights).all()):
        raise ValueError("importance_weights contain a non-finite value (inf or NaN)")
    min_weight = float(weights.min().item())
    if min_weight < 0:
        raise ValueError(f"importance_weights must be non-negative, got a weight of {min_weight}")
    sum_of_squares = float((weights * weights).sum().item())
    if sum_of_squares == 0.0:
        raise ValueError("all importance_weights are 0; the effective sample size is undefined")
    ess = float(weights.sum().item()) ** 2 / (num_tokens * sum_of_squares)
    # Cauchy-Schwarz bounds ESS by 1; rounding can overshoot it by an ulp when the weights are equal.
    return min(ess, 1.0)
