"""Behaviour mismatch: how far the actor's log-probs are from the trainer's for the same weights.

Role: the truncated importance weight ``min(pi / mu, c)`` assumes that ``mu`` (the log-prob the actor
recorded when it sampled a token) and ``pi`` (the trainer's log-prob of it) differ only because the
weights differ. For a token of lag 0 the weights are the same, so any difference is numerical: another
engine, kernel, batch layout or precision (bf16 heads, fused kernels, a stale packed weight). This
module measures it; the trainer logs it as ``rl/behaviour_mismatch``.

Invariants: only lag-0 tokens count (at lag >= 1 the policy itself changed); a step without a lag-0
token has no value (``None``, and the trainer then leaves the metric out of its record rather than
writing NaN, which JSON cannot carry); the result is >= 0 and 0 exactly when the log-probs agree.
"""

from __future__ import annotations

import torch


def behaviour_mismatch(
    trainer_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, token_lags: torch.Tensor
) -> float | None:
    """Mean ``|log pi(y_t) - log mu(y_t)|`` over the tokens of lag 0.

    Args:
        trainer_logprobs: ``[N]`` the trainer's log-prob of each token (before the step's update).
        behaviour_logprobs: ``[N]`` the log-prob the actor recorded when it sampled the token.
        token_lags: ``[N]`` integer lag of each token (trainer version - version that sampled it).

    Returns:
        The mean absolute difference in nats over the lag-0 tokens, or ``None`` when no token has lag 0.

    Raises:
        ValueError: the shapes differ, ``token_lags`` is not an integer tensor, or a lag-0 log-prob is
            not finite.
    """
    if not (trainer_logprobs.shape == behaviour_logprobs.shape == token_lags.shape):
        raise ValueError(
            "trainer_logprobs, behaviour_logprobs and token_lags must have one shape, got "
            f"{tuple(trainer_logprobs.shape)}, {tuple(behaviour_logprobs.shape)}, {tuple(token_lags.shape)}"
        )
    if token_lags.dtype.is_floating_point or token_lags.dtype == torch.bool:
        raise ValueError(f"token_lags must be an integer tensor, got dtype {token_lags.dtype}")
    same_weights = token_lags == 0
    if not bool(same_weights.any()):
        return None
    # float64: a mean over millions of small differences loses digits in float32.
    difference = trainer_logprobs[same_weights].double() - behaviour_logprobs[same_weights].double()
    if not bool(torch.isfinite(difference).all()):
        raise ValueError("a lag-0 token has a non-finite trainer or behaviour log-prob")
    return float(difference.abs().mean().item())
