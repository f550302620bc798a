"""Token entropy of the policy, and the entropy bonus that some recipes add to the loss.

Role: the entropy of pi(. | prefix) at each generated position is the standard diagnostic of entropy
collapse (DAPO's motivation for clip-higher); a bonus ``-coef * H`` added to the loss pushes it up.

Invariants:

* ``logits`` is ``[*, V]`` and ``token_mask`` its leading shape ``[*]`` (``[batch, seq]``, the trainer's
  layout); masked-out positions give entropy 0 and no gradient, whatever their logits hold (inf, NaN):
  they are replaced by zeros before the softmax.
* The entropy is computed from ``log_softmax`` (``H = -sum_v p_v log p_v`` with ``log p = log_softmax(z)``),
  so large logits do not overflow, and a ``-inf`` logit at a masked-in position (a token ruled out) counts
  as probability 0; it lies in ``[0, log V]``, ``log V`` for uniform logits.
* The bonus is a sum over tokens divided by ``denominator`` (``normalisation.loss_denominator``), like the
  policy losses, so micro-batch bonuses add up to the step's.

Gradient: ``dH/dz_v = -p_v (log p_v + H)``; the bonus's is ``-coef / denominator`` times that at masked-in
positions.

Memory: the computation holds a few more tensors of the logits' size (the masked logits, the
log-probabilities and their clamp), each in the logits' dtype promoted to at least float32.

Reference: Williams & Peng 1991, "Function optimization using connectionist reinforcement learning
algorithms" (entropy regularisation); Mnih et al. 2016, arXiv 1602.01783, §4 (A3C's entropy bonus).
"""

from __future__ import annotations

import math

import torch

from pipelinerl.rl.masks import check_token_mask

__all__ = ["entropy_bonus", "token_entropy"]


def token_entropy(logits: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` over the last dimension at each position.

    Args:
        logits: ``[*, V]`` floating-point logits (already divided by the sampling temperature, if the
            entropy of the sampling policy is wanted), V >= 1.
        token_mask: ``[*]`` bool, True for the positions whose entropy counts.

    Returns:
        ``[*]`` entropies in nats, differentiable with respect to ``logits``, 0 where the mask is False.

    Raises:
        ValueError: logits not floating-point or without a vocabulary dimension, or a mask of the wrong shape
            or dtype.
    """
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got dtype {logits.dtype}")
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must be [*, V] with V >= 1, got shape {tuple(logits.shape)}")
    check_token_mask(logits.shape[:-1], token_mask, "the leading shape of logits")

    compute_dtype = torch.promote_types(logits.dtype, torch.float32)
    safe_logits = torch.where(
        token_mask.unsqueeze(-1), logits.to(compute_dtype), torch.zeros((), dtype=compute_dtype)
    )
    log_probs = torch.log_softmax(safe_logits, dim=-1)
    # A -inf logit (a vocabulary entry ruled out) has p = 0: the clamp makes its p * log p 0, not 0 * -inf.
    finite_log_probs = log_probs.clamp(min=torch.finfo(compute_dtype).min)
    entropy = -(log_probs.exp() * finite_log_probs).sum(dim=-1)
    return torch.where(token_mask, entropy, torch.zeros_like(entropy))


def entropy_bonus(
    entropy: torch.Tensor, token_mask: torch.Tensor, coef: float, denominator: float
) -> torch.Tensor:
    """``-coef * sum_t mask_t H_t / denominator``, the scalar to *add* to the loss to maximise entropy.

    Args:
        entropy: ``[*]`` per-token entropies (:func:`token_entropy`'s), differentiable.
        token_mask: ``[*]`` bool; masked-out positions count for nothing whatever they hold.
        coef: the bonus coefficient, a finite number >= 0 (0 turns it off).
        denominator: the step's loss denominator, a finite number > 0.

    Raises:
        ValueError: a mask of the wrong shape or dtype, a negative or non-finite ``coef`` (a negative one
            would minimise entropy), or a ``denominator`` that is not a finite number > 0.
    """
    check_token_mask(entropy.shape, token_mask, "the shape of entropy")
    if not (coef >= 0 and math.isfinite(coef)):
        raise ValueError(
            f"coef must be a finite number >= 0 (the bonus maximises entropy; 0 turns it off), got {coef}"
        )
    if not (denominator > 0 and math.isfinite(denominator)):
        raise ValueError(f"denominator must be a finite number > 0, got {denominator}")
    masked = torch.where(token_mask, entropy, torch.zeros_like(entropy))
    return -coef * masked.sum() / denominator
