"""One optimizer step's math on a batch of sequences: token log-probs, the RL loss, step statistics.

Separate from the trainer process so that it can be tested on a plain ``nn.Module`` and reused by
the benchmarks. Layout of a micro-batch: each row is ``prompt + completion``, right-padded; the
log-prob of completion token ``j`` of a row whose prompt has ``P`` tokens comes from the logits at
position ``P + j - 1`` (paper §2: the loss runs over generated tokens only).

The recipe (``rl.loss``, its clip bounds, ``rl.loss_normalisation``, ``rl.kl``, ``rl.entropy_coef``;
docs/recipes.md) is applied here: the policy loss is chosen by name, every term is divided by the same
step denominator (``rl/normalisation.py``), the KL term compares the policy with a frozen reference
model run on the same micro-batch, and the entropy bonus uses the logits of the same forward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pipelinerl.platform.wire import TrainSequence
from pipelinerl.rl.cispo import cispo_loss
from pipelinerl.rl.entropy import entropy_bonus, token_entropy
from pipelinerl.rl.gspo import gspo_loss
from pipelinerl.rl.kl import KLEstimator, kl_mean, kl_penalty
from pipelinerl.rl.loss import PolicyLossOutput, ppo_clip_loss, truncated_is_loss
from pipelinerl.rl.normalisation import Normalisation, loss_denominator
from pipelinerl.rl.padding import pad_micro_batch

PAD_TOKEN_ID = 0  # any valid id: padded positions are masked out of attention and loss


@dataclass
class TokenRecord:
    """Per-token data of one micro-batch, flattened over its completion tokens."""

    trainer_logprobs: np.ndarray  # float32, log pi (before this step's update)
    behaviour_logprobs: np.ndarray  # float32, log mu recorded by the actor
    token_versions: np.ndarray  # int32, policy version that sampled the token
    token_positions: np.ndarray  # int32, index of the token within its completion
    ratio: np.ndarray  # float32, pi / mu


@dataclass
class CompletionForward:
    """One forward pass over a micro-batch, ``[b, T-1, ...]`` aligned with target positions 1..T-1."""

    logits: torch.Tensor  # [b, T-1, V] float32, divided by the sampling temperature
    logprobs: torch.Tensor  # [b, T-1] log-prob of each target token
    mask: torch.Tensor  # [b, T-1] bool, True exactly at completion tokens


def completion_forward(
    model: Callable[..., object],
    sequences: Sequence[TrainSequence],
    temperature: float,
    device: torch.device | str = "cpu",
) -> CompletionForward:
    """The temperature-scaled logits and the completion tokens' log-probs under ``model`` (whose weights
    are on ``device``), from one forward pass: what the loss, the entropy bonus and the KL term share."""
    rows = [np.concatenate([seq.prompt_token_ids, seq.completion_token_ids]).tolist() for seq in sequences]
    input_ids, attention_mask = pad_micro_batch(rows, pad_value=PAD_TOKEN_ID)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    output = model(input_ids=input_ids, attention_mask=attention_mask.long())
    logits = output.logits[:, :-1].float() / temperature  # type: ignore[attr-defined]
    targets = input_ids[:, 1:]
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    mask = torch.zeros_like(targets, dtype=torch.bool)
    for row, seq in enumerate(sequences):
        start = len(seq.prompt_token_ids) - 1
        mask[row, start : start + len(seq.completion_token_ids)] = True
    return CompletionForward(logits=logits, logprobs=logprobs, mask=mask)


def completion_logprobs(
    model: Callable[..., object],
    sequences: Sequence[TrainSequence],
    temperature: float,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each completion token under ``model`` (whose weights are on ``device``).

    Returns ``(logprobs, mask)``, both ``[b, T-1]`` on ``device``, aligned with target positions
    1..T-1 of the padded rows; ``mask`` is True exactly at completion tokens.
    """
    forward = completion_forward(model, sequences, temperature, device)
    return forward.logprobs, forward.mask


def per_token(
    sequences: Sequence[TrainSequence], mask: torch.Tensor, field: str, dtype: torch.dtype
) -> torch.Tensor:
    """A per-completion-token field of ``sequences`` scattered into the ``mask`` layout."""
    out = torch.zeros(mask.shape, dtype=dtype)
    for row, seq in enumerate(sequences):
        values = getattr(seq, field)
        start = len(seq.prompt_token_ids) - 1
        out[row, start : start + len(values)] = torch.as_tensor(np.asarray(values), dtype=dtype)
    return out.to(mask.device)  # built on the host, row by row; one copy to the model's device


@dataclass
class MicroBatchResult:
    loss: torch.Tensor
    clipped_fraction: float
    tokens: TokenRecord
    num_tokens: int = 0  # completion tokens of the micro-batch (the weight of its fractions and means)
    clipped_low_fraction: float = 0.0  # share of its tokens clipped at the lower bound
    clipped_high_fraction: float = 0.0  # at the upper bound (or truncated_is's cap)
    kl_mean: float | None = None  # mean per-token KL estimate to the reference (KL term on)
    entropy_mean: float | None = None  # mean token entropy of the policy (entropy bonus on)


def policy_loss(
    loss_name: str,
    logprobs: torch.Tensor,
    behaviour: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    denominator: float,
    *,
    is_cap: float = 5.0,
    ppo_clip_epsilon: float = 0.2,
    clip_low: float | None = None,
    clip_high: float | None = None,
) -> PolicyLossOutput:
    """The policy loss ``loss_name`` (``rl.loss``) of these tokens over ``denominator``; an empty clip
    bound is the loss's own default (ppo_clip: ``ppo_clip_epsilon`` on both sides)."""
    bounds = {
        name: value for name, value in (("clip_low", clip_low), ("clip_high", clip_high)) if value is not None
    }
    if loss_name == "truncated_is":
        if bounds:
            raise ValueError(f"truncated_is takes no clip bounds (its cap is is_cap); got {bounds}")
        return truncated_is_loss(logprobs, behaviour, advantages, mask, denominator, is_cap=is_cap)
    if loss_name == "ppo_clip":
        return ppo_clip_loss(
            logprobs, behaviour, advantages, mask, denominator, clip_epsilon=ppo_clip_epsilon, **bounds
        )
    if loss_name == "gspo":
        return gspo_loss(logprobs, behaviour, advantages, mask, denominator, **bounds)
    if loss_name == "cispo":
        return cispo_loss(logprobs, behaviour, advantages, mask, denominator, **bounds)
    raise ValueError(f"unknown loss {loss_name!r}; valid: truncated_is, ppo_clip, gspo, cispo")


def micro_batch_loss(
    model: Callable[..., object],
    sequences: Sequence[TrainSequence],
    *,
    num_sequences: int,
    loss_name: str,
    is_cap: float,
    ppo_clip_epsilon: float,
    temperature: float,
    device: torch.device | str = "cpu",
    clip_low: float | None = None,
    clip_high: float | None = None,
    normalisation: Normalisation = "sequence",
    num_tokens: int | None = None,
    max_new_tokens: int | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    reference_model: Callable[..., object] | None = None,
    entropy_coef: float = 0.0,
) -> MicroBatchResult:
    """The differentiable loss of one micro-batch: the policy loss ``loss_name``, plus ``kl_coef`` times
    the KL estimate to ``reference_model`` and minus ``entropy_coef`` times the token entropy, each a sum
    over the micro-batch's completion tokens divided by the step's denominator (``normalisation``: the
    step's ``num_sequences``, its completion tokens ``num_tokens``, or ``num_sequences`` x
    ``max_new_tokens``), so the micro-batch losses of a step add up to its loss.

    Inputs, loss and per-token statistics are computed on ``device`` (the model's); only the
    ``TokenRecord`` that is logged comes back to the host."""
    if kl_coef > 0 and reference_model is None:
        raise ValueError(f"kl_coef={kl_coef} needs a reference_model to compare the policy with")
    for needed, name, value in (
        ("token", "num_tokens", num_tokens),
        ("constant", "max_new_tokens", max_new_tokens),
    ):
        if normalisation == needed and value is None:
            raise ValueError(f"normalisation={needed!r} needs the step's {name}")
    denominator = loss_denominator(
        normalisation,
        num_sequences=num_sequences,
        # a count the chosen normalisation does not use may be left out (loss_denominator checks all three)
        num_tokens=num_tokens if num_tokens is not None else 1,
        max_new_tokens=max_new_tokens if max_new_tokens is not None else 1,
    )
    forward = completion_forward(model, sequences, temperature, device)
    logprobs, mask = forward.logprobs, forward.mask
    behaviour = per_token(sequences, mask, "behaviour_logprobs", torch.float32)
    advantages = torch.tensor([seq.advantage for seq in sequences], dtype=torch.float32)
    advantages = advantages[:, None].expand(mask.shape).contiguous().to(mask.device)
    out = policy_loss(
        loss_name,
        logprobs,
        behaviour,
        advantages,
        mask,
        denominator,
        is_cap=is_cap,
        ppo_clip_epsilon=ppo_clip_epsilon,
        clip_low=clip_low,
        clip_high=clip_high,
    )
    loss = out.loss
    kl_value = entropy_value = None
    if kl_coef > 0 and reference_model is not None:
        with torch.no_grad():
            reference, _ = completion_logprobs(reference_model, sequences, temperature, device)
        kl = kl_penalty(logprobs, reference, mask, kl_estimator)
        loss = loss + kl_coef * kl.sum() / denominator  # kl_penalty is 0 off the mask
        kl_value = kl_mean(kl.detach(), mask)
    if entropy_coef > 0:
        entropy = token_entropy(forward.logits, mask)
        loss = loss + entropy_bonus(entropy, mask, entropy_coef, denominator)
        entropy_value = masked_mean(entropy.detach(), mask)
    versions = per_token(sequences, mask, "token_versions", torch.int64)
    positions = torch.cumsum(mask.long(), dim=1) - 1
    trained = logprobs.detach()
    record = TokenRecord(
        trainer_logprobs=trained[mask].cpu().numpy().astype(np.float32),
        behaviour_logprobs=behaviour[mask].cpu().numpy(),
        token_versions=versions[mask].cpu().numpy().astype(np.int32),
        token_positions=positions[mask].cpu().numpy().astype(np.int32),
        # pi/mu per token whatever the loss weighs (gspo's ratio is per sequence)
        ratio=torch.exp(trained.float() - behaviour)[mask].cpu().numpy().astype(np.float32),
    )
    return MicroBatchResult(
        loss=loss,
        clipped_fraction=out.clipped_fraction,
        tokens=record,
        num_tokens=int(mask.sum()),
        clipped_low_fraction=out.clipped_low_fraction,
        clipped_high_fraction=out.clipped_high_fraction,
        kl_mean=kl_value,
        entropy_mean=entropy_value,
    )


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """The mean of ``values`` over ``mask`` (0.0 when it selects nothing)."""
    count = int(mask.sum())
    return float(values[mask].double().sum()) / count if count else 0.0


def concat_records(records: Sequence[TokenRecord]) -> TokenRecord:
    return TokenRecord(
        *(np.concatenate([getattr(r, name) for r in records]) for name in TokenRecord.__dataclass_fields__)
    )
