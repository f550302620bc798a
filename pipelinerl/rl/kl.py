"""Per-token estimators of KL(pi || pi_ref), for a KL penalty towards a frozen reference policy.

Role: GRPO-style recipes add ``beta * KL(pi || pi_ref)`` to the loss to keep the policy near a reference
(usually the initial model); the sampled tokens give a per-token Monte-Carlo estimate of it.

Invariants:

* ``logprobs``, ``reference_logprobs`` and ``token_mask`` have the same shape (``[batch, seq]`` or flat);
  ``token_mask`` is bool. Masked-out positions give 0 and no gradient, whatever they hold (their log-ratio is
  zeroed before any ``exp``).
* Estimates are differentiable with respect to ``logprobs``; ``reference_logprobs`` is treated as constant.
* Every estimator is 0 where the two policies agree on the token; ``k2`` and ``k3`` are >= 0 everywhere.

Formulas, with ``x = log pi_t - log pi_ref_t`` (tokens sampled from pi):

* ``k1 = x``: unbiased, high variance, negative for half the tokens; gradient 1.
* ``k2 = x^2 / 2``: biased, low variance; gradient ``x``.
* ``k3 = exp(-x) + x - 1`` (= ``r - 1 - log r`` with ``r = pi_ref / pi``): unbiased, low variance, >= 0;
  gradient ``1 - exp(-x)``. GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300) uses it.

Reference: Schulman 2020, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

from pipelinerl.rl.loss import masked_log_ratio
from pipelinerl.rl.masks import check_token_mask

__all__ = ["KL_ESTIMATORS", "KLEstimator", "kl_mean", "kl_penalty"]

KLEstimator = Literal["k1", "k2", "k3"]
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)


def kl_penalty(
    logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor,
    token_mask: torch.Tensor,
    estimator: KLEstimator,
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) by ``estimator`` (see the module docstring).

    Args:
        logprobs: ``[*]`` log pi(y_t) under the trainer's current weights, requires grad.
        reference_logprobs: ``[*]`` log pi_ref(y_t) under the reference policy (treated as constant).
        token_mask: ``[*]`` bool, True for tokens that are trained on.
        estimator: ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        ``[*]`` estimates in ``logprobs``' dtype promoted to at least float32, 0 where the mask is False. The
        penalty a loss adds is ``beta * kl_penalty(...).sum() / denominator``.

    Raises:
        ValueError: unknown estimator, shapes differ, non-bool mask or integer logprobs.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")
    if reference_logprobs.shape != logprobs.shape:
        raise ValueError(
            f"reference_logprobs has shape {tuple(reference_logprobs.shape)}, "
            f"expected the shape of logprobs {tuple(logprobs.shape)}"
        )
    check_token_mask(logprobs.shape, token_mask, "the shape of logprobs")
    if not logprobs.is_floating_point():
        raise ValueError(f"logprobs must be a floating-point tensor, got dtype {logprobs.dtype}")

    log_ratio = masked_log_ratio(logprobs, reference_logprobs, token_mask)
    if estimator == "k1":
        values = log_ratio
    elif estimator == "k2":
        values = 0.5 * log_ratio**2
    else:
        values = torch.expm1(-log_ratio) + log_ratio
    return torch.where(token_mask, values, torch.zeros_like(values))


def kl_mean(values: torch.Tensor, token_mask: torch.Tensor) -> float:
    """Mean of per-token ``values`` (e.g. :func:`kl_penalty`'s) over the masked-in tokens, for logging.

    Summed in float64 (a step has millions of tokens); 0.0 when no token is masked in.

    Raises:
        ValueError: shapes differ or the mask is not bool.
    """
    check_token_mask(values.shape, token_mask, "the shape of values")
    num_tokens = int(token_mask.sum().item())
    if num_tokens == 0:
        return 0.0
    return float(values.detach()[token_mask].to(torch.float64).sum().item()) / num_tokens
