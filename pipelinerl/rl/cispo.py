"""CISPO: Clipped IS-weight Policy Optimization, REINFORCE whose detached importance weight is clipped.

Role: the MiniMax-M1 alternative to PPO-clip. PPO drops the gradient of every token whose ratio left the clip
range, and those are often the rare "fork" tokens (e.g. "However", "Recheck") that matter most for
reasoning; CISPO clips the *weight* instead and keeps every token's gradient.

Invariants:

* Every per-token tensor has the same shape (``[batch, seq]`` or flat ``[N]``); ``token_mask`` is bool and
  masked-out positions contribute nothing to the loss, its gradient or the diagnostics, whatever they hold.
* The loss is a sum over tokens divided by ``denominator`` (``normalisation.loss_denominator``; MiniMax-M1
  uses the token count, DAPO's token-level mean), so micro-batch losses add up to the step's.
* ``ratio`` is the raw detached ratio pi/mu; ``importance_weights`` the clipped weight that multiplied the
  advantage (both 0 where masked out).

Formula: ``r_t = exp(log pi_t - log mu_t)``, ``w_t = sg(clip(r_t, 1 - eps_low, 1 + eps_high))`` (no lower
bound when ``clip_low`` is None) and ``L = -(1/denominator) sum_t mask_t w_t A_t log pi_t``.

Gradient: ``dL/dlogprobs_t = -mask_t * w_t * A_t / denominator`` for every masked-in token, clipped or not
(unlike PPO's, which is 0 for a clipped token). With no lower bound and a cap ``c = 1 + eps_high`` this is
``loss.truncated_is_loss`` with ``is_cap = c`` (up to the denominator).

Reference: MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention",
arXiv 2506.13585, §3.1, eqs. 4-5 (the paper sets no lower bound, "setting eps_low to a large value", and
tunes eps_high only; the default 0.28 here is DAPO's clip-higher eps_high,
Yu et al. 2025, arXiv 2503.14476, §3.1).
"""

from __future__ import annotations

import torch

from pipelinerl.rl.loss import (
    PolicyLossOutput,
    masked_fraction,
    masked_log_ratio,
    validate_clip,
    validate_denominator,
    validate_policy_inputs,
)

__all__ = ["cispo_loss"]


def cispo_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
    denominator: float,
    clip_low: float | None = None,
    clip_high: float = 0.28,
) -> PolicyLossOutput:
    """CISPO's REINFORCE with clipped, detached IS weights (see the module docstring).

    Args:
        logprobs: ``[*]`` log pi(y_t) under the trainer's current weights, requires grad.
        behaviour_logprobs: ``[*]`` log mu(y_t) recorded by the actor (treated as constant).
        advantages: ``[*]`` per-token advantage.
        token_mask: ``[*]`` bool, True for tokens that are trained on.
        denominator: the step's loss denominator, a finite number > 0.
        clip_low: eps_low >= 0 of the lower bound ``1 - eps_low`` of the weight; ``None`` (the paper's
            choice) sets none. A value >= 1 also sets none in effect (the ratio is positive).
        clip_high: eps_high >= 0 of the upper bound ``1 + eps_high``.

    Returns:
        :class:`PolicyLossOutput`; ``clipped_fraction`` is the share of masked-in tokens whose weight was
        clipped, ``clipped_low_fraction`` those with ``r_t < 1 - eps_low`` and ``clipped_high_fraction``
        those with ``r_t > 1 + eps_high``.

    Raises:
        ValueError: shapes differ, the mask is not bool, ``denominator`` is not a finite number > 0 or a
            clip width a finite number >= 0.
    """
    validate_policy_inputs(logprobs, behaviour_logprobs, advantages, token_mask)
    validate_denominator(denominator)
    if clip_low is not None:
        validate_clip("clip_low", clip_low, allow_zero=True)
    validate_clip("clip_high", clip_high, allow_zero=True)

    log_ratio = masked_log_ratio(logprobs, behaviour_logprobs, token_mask).detach()
    zeros = torch.zeros_like(log_ratio)
    ratio = torch.where(token_mask, torch.exp(log_ratio), zeros)
    lower = None if clip_low is None else 1.0 - clip_low
    importance_weights = torch.where(token_mask, torch.clamp(ratio, min=lower, max=1.0 + clip_high), zeros)
    masked_advantages = torch.where(token_mask, advantages.to(ratio.dtype), zeros)

    per_token = masked_advantages * importance_weights * logprobs.to(ratio.dtype)
    per_token = torch.where(token_mask, per_token, torch.zeros_like(per_token))
    loss = -per_token.sum() / denominator

    high = ratio > 1.0 + clip_high
    low = ratio < lower if lower is not None else torch.zeros_like(token_mask)
    return PolicyLossOutput(
        loss=loss,
        ratio=ratio,
        importance_weights=importance_weights,
        clipped_fraction=masked_fraction(low | high, token_mask),
        clipped_low_fraction=masked_fraction(low, token_mask),
        clipped_high_fraction=masked_fraction(high, token_mask),
    )
