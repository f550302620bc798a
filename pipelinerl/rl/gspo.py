"""GSPO: Group Sequence Policy Optimization, PPO-style clipping of a sequence-level importance ratio.

Role: the sequence-level alternative to the token-level losses of ``loss.py``. The reward is given per
sequence, so GSPO weights and clips per sequence too: one ratio per row, the geometric mean of its tokens'
ratios pi/mu (length-normalised, so long and short sequences have ratios of the same scale), and a whole
sequence is clipped or not.

Invariants:

* Tensors are ``[batch, seq]`` with one row per sequence (the trainer's layout); ``token_mask`` is bool and
  masked-out positions contribute nothing to the loss, its gradient or the diagnostics, whatever they hold.
  A row with no masked-in token contributes nothing (no NaN).
* The loss is a sum over sequences divided by ``denominator`` (``normalisation.loss_denominator``: the
  step's sequence count, token count or a constant), so micro-batch losses add up to the step's.
* ``ratio`` and ``importance_weights`` are detached diagnostics: the row's sequence ratio ``s_i`` at each of
  its masked-in tokens, 0 elsewhere.

Formula: with ``n_i`` the row's masked-in token count,
``s_i = exp((1/n_i) sum_t mask_it (log pi_it - log mu_it))`` (differentiable), ``A_i`` the row's advantage and
``L = -(1/denominator) sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)``.

Gradient: where the unclipped term is the minimum,
``dL/dlogprobs_it = -mask_it * s_i * A_i / (n_i * denominator)`` (every token of the row shares it); 0 for
every token of a row whose clipped term is strictly smaller.

Reference: Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071, eqs. 5-7; §5.1 sets
the clip range to ``eps_low = 3e-4``, ``eps_high = 4e-4`` (a sequence ratio is a geometric mean, so it stays
much closer to 1 than a token ratio and needs a range two orders of magnitude narrower than PPO's 0.2).
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

__all__ = ["gspo_loss"]


def gspo_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
    denominator: float,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> PolicyLossOutput:
    """GSPO's clipped sequence-level surrogate (see the module docstring for the formula and gradient).

    Args:
        logprobs: ``[batch, seq]`` log pi(y_t) under the trainer's current weights, requires grad.
        behaviour_logprobs: ``[batch, seq]`` log mu(y_t) recorded by the actor (treated as constant).
        advantages: ``[batch, seq]`` the sequence's advantage broadcast over its tokens; ``A_i`` is the mean
            over the row's masked-in tokens (their common value).
        token_mask: ``[batch, seq]`` bool, True for tokens that are trained on.
        denominator: the step's loss denominator, a finite number > 0.
        clip_low: eps_low >= 0 of the lower bound ``1 - eps_low`` of the sequence ratio.
        clip_high: eps_high >= 0 of the upper bound ``1 + eps_high`` (both 0: the range is {1}, on-policy
            data then gives sequence-level REINFORCE, the gradient of ``-A_i mean_t log pi_it``).

    Returns:
        :class:`PolicyLossOutput` whose ``ratio`` and ``importance_weights`` are ``s_i`` broadcast to the
        row's masked-in tokens; ``clipped_fraction`` is the share of masked-in tokens that belong to a row
        whose clipped term is strictly smaller than the unclipped one (the row gets no gradient), split into
        ``clipped_low_fraction`` (``s_i < 1 - eps_low``, ``A_i < 0``) and ``clipped_high_fraction``
        (``s_i > 1 + eps_high``, ``A_i > 0``).

    Raises:
        ValueError: shapes differ or are not ``[batch, seq]``, the mask is not bool, ``denominator`` is not a
            finite number > 0 or a clip width a finite number >= 0.
    """
    validate_policy_inputs(logprobs, behaviour_logprobs, advantages, token_mask)
    if logprobs.dim() != 2:
        raise ValueError(
            "gspo_loss needs [batch, seq] tensors with one row per sequence, "
            f"got shape {tuple(logprobs.shape)}"
        )
    validate_denominator(denominator)
    validate_clip("clip_low", clip_low, allow_zero=True)
    validate_clip("clip_high", clip_high, allow_zero=True)

    log_ratio = masked_log_ratio(logprobs, behaviour_logprobs, token_mask)
    counts = token_mask.sum(dim=1)
    has_tokens = counts > 0
    safe_counts = counts.clamp(min=1).to(log_ratio.dtype)
    # An empty row has log s_i = 0 (s_i = 1) and advantage 0, so its term and gradient are 0.
    sequence_ratio = torch.exp(log_ratio.sum(dim=1) / safe_counts)
    zeros = torch.zeros_like(log_ratio)
    masked_advantages = torch.where(token_mask, advantages.to(log_ratio.dtype), zeros)
    sequence_advantage = masked_advantages.sum(dim=1) / safe_counts

    unclipped = sequence_ratio * sequence_advantage
    clipped = torch.clamp(sequence_ratio, 1.0 - clip_low, 1.0 + clip_high) * sequence_advantage
    per_sequence = torch.minimum(unclipped, clipped)
    per_sequence = torch.where(has_tokens, per_sequence, torch.zeros_like(per_sequence))
    loss = -per_sequence.sum() / denominator

    detached_ratio = sequence_ratio.detach()
    ratio = torch.where(token_mask, detached_ratio[:, None].expand_as(zeros), zeros)
    active = (clipped.detach() < unclipped.detach()) & has_tokens
    low = active & (detached_ratio < 1.0 - clip_low)
    high = active & (detached_ratio > 1.0 + clip_high)
    return PolicyLossOutput(
        loss=loss,
        ratio=ratio,
        importance_weights=ratio,
        clipped_fraction=masked_fraction(active[:, None].expand_as(token_mask), token_mask),
        clipped_low_fraction=masked_fraction(low[:, None].expand_as(token_mask), token_mask),
        clipped_high_fraction=masked_fraction(high[:, None].expand_as(token_mask), token_mask),
    )
