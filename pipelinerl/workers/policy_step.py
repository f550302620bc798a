"""One optimizer step's math on a batch of sequences: token log-probs, the RL loss, step statistics.

Separate from the trainer process so that it can be tested on a plain ``nn.Module`` and reused by
the benchmarks. Layout of a micro-batch: each row is ``prompt + completion``, right-padded; the
log-prob of completion token ``j`` of a row whose prompt has ``P`` tokens comes from the logits at
position ``P + j - 1`` (paper §2: the loss runs over generated tokens only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pipelinerl.platform.wire import TrainSequence
from pipelinerl.rl.loss import ppo_clip_loss, truncated_is_loss
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
    return logprobs, mask


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
) -> MicroBatchResult:
    """The differentiable loss of one micro-batch, normalised by the step's ``num_sequences``.

    Inputs, loss and per-token statistics are computed on ``device`` (the model's); only the
    ``TokenRecord`` that is logged comes back to the host."""
    logprobs, mask = completion_logprobs(model, sequences, temperature, device)
    behaviour = per_token(sequences, mask, "behaviour_logprobs", torch.float32)
    advantages = torch.tensor([seq.advantage for seq in sequences], dtype=torch.float32)
    advantages = advantages[:, None].expand(mask.shape).contiguous().to(mask.device)
    if loss_name == "ppo_clip":
        out = ppo_clip_loss(
            logprobs, behaviour, advantages, mask, num_sequences, clip_epsilon=ppo_clip_epsilon
        )
    else:
        out = truncated_is_loss(logprobs, behaviour, advantages, mask, num_sequences, is_cap=is_cap)
    versions = per_token(sequences, mask, "token_versions", torch.int64)
    positions = torch.cumsum(mask.long(), dim=1) - 1
    record = TokenRecord(
        trainer_logprobs=logprobs.detach()[mask].cpu().numpy().astype(np.float32),
        behaviour_logprobs=behaviour[mask].cpu().numpy(),
        token_versions=versions[mask].cpu().numpy().astype(np.int32),
        token_positions=positions[mask].cpu().numpy().astype(np.int32),
        ratio=out.ratio[mask].detach().cpu().numpy().astype(np.float32),
    )
    return MicroBatchResult(loss=out.loss, clipped_fraction=out.clipped_fraction, tokens=record)


def concat_records(records: Sequence[TokenRecord]) -> TokenRecord:
    return TokenRecord(
        *(np.concatenate([getattr(r, name) for r in records]) for name in TokenRecord.__dataclass_fields__)
    )
