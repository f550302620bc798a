"""Policy-gradient losses for PipelineRL: REINFORCE with truncated importance sampling, and PPO-clip
(with DAPO's decoupled clip-higher); the helpers the other recipes' losses share (``gspo.py``, ``cispo.py``).

Role: turn the trainer's current token log-probabilities, the actor's recorded (behaviour) log-probabilities
and per-token advantages into one differentiable scalar plus the diagnostics the trainer logs.

Invariants:

* Every per-token tensor has the same shape (``[batch, seq]`` or flat ``[N]``); ``token_mask`` is bool and
  masked-out positions (padding, prompt) contribute nothing to the loss, its gradient or the diagnostics,
  whatever values they hold.
* Sequences cut at ``actor.max_new_tokens`` reach the loss like any other: the policy for them
  (``rl.truncated``) is applied upstream, to rewards and advantages (``workers/preprocessor.py``'s
  ``RewardPolicy``): ``train`` leaves them as they are, ``mask`` gives them advantage 0 (their terms
  A·w·log pi vanish, so they add nothing to the loss or its gradient, while their tokens still count in the
  ESS and lag diagnostics), ``penalise`` gives them a fixed negative reward before advantages are computed.
* The loss is a *sum* over tokens divided by ``num_sequences``, the optimizer step's total sequence count,
  not the micro-batch's (or, under another ``normalisation.py`` choice, the step's token count or a constant:
  the argument keeps its name and takes any such denominator >= 1). Micro-batch losses therefore add up to the
  step loss and gradient accumulation needs no rescaling.
* ``ratio`` and ``importance_weights`` are detached diagnostics; ``ratio`` is the raw policy ratio
  pi/mu and ``importance_weights`` is what multiplied the advantage in the loss.

Reference: Piché et al. 2025, "PipelineRL", arXiv 2509.19128, §"Numbers to implement" of the project spec
(importance weight w = min(pi/mu, c) with c = 5; L = -(1/n_seq) sum_seq sum_t A_seq w_t log pi(y_t)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "PolicyLossOutput",
    "masked_fraction",
    "masked_log_ratio",
    "ppo_clip_loss",
    "truncated_is_loss",
    "validate_clip",
    "validate_denominator",
    "validate_policy_inputs",
]


@dataclass(frozen=True)
class PolicyLossOutput:
    """Result of a policy loss.

    Attributes:
        loss: scalar, differentiable with respect to ``logprobs``.
        ratio: ``[*]`` detached ``exp(logprobs - behaviour_logprobs)``, untruncated, 0 where mask is False.
        importance_weights: ``[*]`` detached weights actually used in the loss (``min(ratio, cap)`` for
            truncated IS, the raw ratio for PPO), 0 where the mask is False.
        clipped_fraction: share of masked-in tokens whose weight was truncated (IS) or clipped (PPO);
            0.0 when no token is masked in.
        clipped_low_fraction: share of masked-in tokens whose clipping was at the lower bound ``1 - clip_low``
            (always 0 for truncated IS, which has none).
        clipped_high_fraction: share of masked-in tokens whose clipping was at the upper bound (``1 +
            clip_high``, or the cap ``c`` of truncated IS). The two are disjoint and add up to
            ``clipped_fraction``.
    """

    loss: torch.Tensor
    ratio: torch.Tensor
    importance_weights: torch.Tensor
    clipped_fraction: float
    clipped_low_fraction: float = 0.0
    clipped_high_fraction: float = 0.0


def validate_policy_inputs(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
) -> None:
    """Refuse per-token inputs shaped unlike ``logprobs``, a non-bool mask or integer logprobs."""
    for name, tensor in (
        ("behaviour_logprobs", behaviour_logprobs),
        ("advantages", advantages),
        ("token_mask", token_mask),
    ):
        if tensor.shape != logprobs.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)}, "
                f"expected the shape of logprobs {tuple(logprobs.shape)}"
            )
    if token_mask.dtype != torch.bool:
        raise ValueError(f"token_mask must be a bool tensor, got dtype {token_mask.dtype}")
    if not logprobs.is_floating_point():
        raise ValueError(f"logprobs must be a floating-point tensor, got dtype {logprobs.dtype}")


def validate_denominator(denominator: float, name: str = "denominator") -> None:
    """Refuse a loss denominator that is not a finite number > 0 (it divides the step's summed loss)."""
    if not (denominator > 0 and math.isfinite(denominator)):
        raise ValueError(
            f"{name} must be a finite number > 0 (the step's sequence count, token count or constant, "
            f"see normalisation.loss_denominator), got {denominator}"
        )


def validate_clip(name: str, value: float, *, allow_zero: bool = False) -> None:
    """Refuse a clip half-width that is not a finite number > 0 (>= 0 with ``allow_zero``)."""
    if allow_zero:
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    elif not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")


def _validate(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
    num_sequences: float,
) -> None:
    validate_policy_inputs(logprobs, behaviour_logprobs, advantages, token_mask)
    if not (num_sequences >= 1 and math.isfinite(num_sequences)):
        raise ValueError(
            f"num_sequences must be >= 1 and finite (the optimizer step's sequence count, or the loss "
            f"denominator normalisation.loss_denominator gives), got {num_sequences}"
        )


def masked_log_ratio(
    logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, token_mask: torch.Tensor
) -> torch.Tensor:
    """``logprobs - behaviour_logprobs`` with masked-out positions set to 0 *before* ``exp``.

    Zeroing before exponentiating keeps garbage in padding (e.g. huge differences) from producing inf, whose
    gradient through a later ``where`` would be 0 * inf = NaN.
    """
    compute_dtype = torch.promote_types(logprobs.dtype, torch.float32)
    log_ratio = logprobs.to(compute_dtype) - behaviour_logprobs.detach().to(compute_dtype)
    return torch.where(token_mask, log_ratio, torch.zeros_like(log_ratio))


def masked_fraction(flags: torch.Tensor, token_mask: torch.Tensor) -> float:
    """Share of masked-in positions where ``flags`` is True; 0.0 when none is masked in."""
    num_tokens = int(token_mask.sum().item())
    if num_tokens == 0:
        return 0.0
    return float((flags & token_mask).sum().item()) / num_tokens


# The names the module used before the other recipes shared them.
_masked_log_ratio = masked_log_ratio
_fraction = masked_fraction


def truncated_is_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
    num_sequences: float,
    is_cap: float = 5.0,
) -> PolicyLossOutput:
    """REINFORCE with truncated importance sampling, PipelineRL's default policy loss.

    ``L = -(1/num_sequences) * sum_t mask_t * A_t * min(r_t, c).detach() * logprobs_t`` with
    ``r_t = exp(logprobs_t - behaviour_logprobs_t)``, so
    ``dL/dlogprobs_t = -mask_t * A_t * w_t / num_sequences``.

    Args:
        logprobs: ``[*]`` log pi(y_t) under the trainer's current weights, requires grad.
        behaviour_logprobs: ``[*]`` log mu(y_t) the actor recorded when it sampled y_t (treated as constant).
        advantages: ``[*]`` per-token advantage (the sequence's advantage broadcast over its tokens).
        token_mask: ``[*]`` bool, True for tokens that are trained on.
        num_sequences: the optimizer step's total number of sequences (>= 1), or the loss denominator
            ``normalisation.loss_denominator`` gives for another normalisation.
        is_cap: truncation level c > 0 of the importance weight; the paper's default is 5.

    Returns:
        :class:`PolicyLossOutput`; ``clipped_fraction`` (= ``clipped_high_fraction``) is the share of
        masked-in tokens with ``r_t > c``; ``clipped_low_fraction`` is 0 (no lower bound).

    Reference: Piché et al. 2025, arXiv 2509.19128, §"Numbers to implement" (importance weight and loss).
    """
    _validate(logprobs, behaviour_logprobs, advantages, token_mask, num_sequences)
    if not is_cap > 0:
        raise ValueError(f"is_cap must be > 0, got {is_cap}")

    log_ratio = masked_log_ratio(logprobs, behaviour_logprobs, token_mask).detach()
    ratio = torch.where(token_mask, torch.exp(log_ratio), torch.zeros_like(log_ratio))
    importance_weights = torch.clamp(ratio, max=is_cap)
    masked_advantages = torch.where(token_mask, advantages.to(ratio.dtype), torch.zeros_like(ratio))

    per_token = masked_advantages * importance_weights * logprobs.to(ratio.dtype)
    per_token = torch.where(token_mask, per_token, torch.zeros_like(per_token))
    loss = -per_token.sum() / num_sequences
    truncated = masked_fraction(ratio > is_cap, token_mask)
    return PolicyLossOutput(
        loss=loss,
        ratio=ratio,
        importance_weights=importance_weights,
        clipped_fraction=truncated,
        clipped_low_fraction=0.0,
        clipped_high_fraction=truncated,
    )


def ppo_clip_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
    num_sequences: float,
    clip_epsilon: float = 0.2,
    clip_low: float | None = None,
    clip_high: float | None = None,
) -> PolicyLossOutput:
    """PPO clipped surrogate, the option the paper lists beside truncated IS, with DAPO's clip-higher.

    ``L = -(1/num_sequences) * sum_t mask_t * min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)`` where
    the ratio ``r_t = exp(logprobs_t - behaviour_logprobs_t)`` is differentiable, so
    ``dL/dlogprobs_t = -mask_t * r_t * A_t / num_sequences`` where the unclipped term is the minimum, 0 where
    the clipped one is strictly smaller (``r_t > 1 + eps_high`` with ``A_t > 0``, or ``r_t < 1 - eps_low``
    with ``A_t < 0``).

    ``eps_low`` and ``eps_high`` are ``clip_low`` and ``clip_high``, each ``clip_epsilon`` when not given
    (symmetric PPO, the behaviour before clip-higher). DAPO decouples them and raises the upper one
    (``eps_low = 0.2``, ``eps_high = 0.28``) so that low-probability tokens can grow, against entropy
    collapse.

    Args:
        logprobs: ``[*]`` log pi(y_t) under the trainer's current weights, requires grad.
        behaviour_logprobs: ``[*]`` log mu(y_t) recorded by the actor (treated as constant).
        advantages: ``[*]`` per-token advantage.
        token_mask: ``[*]`` bool, True for tokens that are trained on.
        num_sequences: the optimizer step's total number of sequences (>= 1), or the loss denominator
            ``normalisation.loss_denominator`` gives for another normalisation.
        clip_epsilon: eps > 0 of the symmetric clip range ``[1 - eps, 1 + eps]``.
        clip_low: eps_low > 0 of the lower bound ``1 - eps_low``; ``None`` takes ``clip_epsilon``.
        clip_high: eps_high > 0 of the upper bound ``1 + eps_high``; ``None`` takes ``clip_epsilon``.

    Returns:
        :class:`PolicyLossOutput` with ``importance_weights`` equal to the raw ratio; ``clipped_fraction`` is
        the share of masked-in tokens where the clipped term is strictly smaller than the unclipped one, i.e.
        where clipping zeroes the token's gradient; ``clipped_low_fraction`` / ``clipped_high_fraction`` split
        it by the bound that did so.

    Reference: Piché et al. 2025, arXiv 2509.19128, §"Numbers to implement" (PPO clip option);
    Schulman et al. 2017, arXiv 1707.06347, eq. 7; Yu et al. 2025 (DAPO), arXiv 2503.14476, eq. 10
    (clip-higher).
    """
    _validate(logprobs, behaviour_logprobs, advantages, token_mask, num_sequences)
    if not clip_epsilon > 0:
        raise ValueError(f"clip_epsilon must be > 0, got {clip_epsilon}")
    eps_low = clip_epsilon if clip_low is None else clip_low
    eps_high = clip_epsilon if clip_high is None else clip_high
    validate_clip("clip_low", eps_low)
    validate_clip("clip_high", eps_high)

    log_ratio = masked_log_ratio(logprobs, behaviour_logprobs, token_mask)
    differentiable_ratio = torch.exp(log_ratio)
    masked_advantages = torch.where(token_mask, advantages.to(log_ratio.dtype), torch.zeros_like(log_ratio))

    unclipped = differentiable_ratio * masked_advantages
    clipped = torch.clamp(differentiable_ratio, 1.0 - eps_low, 1.0 + eps_high) * masked_advantages
    per_token = torch.minimum(unclipped, clipped)
    per_token = torch.where(token_mask, per_token, torch.zeros_like(per_token))
    loss = -per_token.sum() / num_sequences

    ratio = torch.where(token_mask, differentiable_ratio.detach(), torch.zeros_like(log_ratio))
    active = clipped.detach() < unclipped.detach()
    return PolicyLossOutput(
        loss=loss,
        ratio=ratio,
        importance_weights=ratio,
        clipped_fraction=masked_fraction(active, token_mask),
        clipped_low_fraction=masked_fraction(active & (ratio < 1.0 - eps_low), token_mask),
        clipped_high_fraction=masked_fraction(active & (ratio > 1.0 + eps_high), token_mask),
    )
