"""The token mask every per-token statistic and loss takes: bool, of its values' shape."""

from __future__ import annotations

import torch


def check_token_mask(shape: torch.Size, token_mask: torch.Tensor, expected: str) -> None:
    """``ValueError`` unless ``token_mask`` is bool and of ``shape`` (``expected`` names that shape in the
    message, e.g. ``"the shape of logprobs"``)."""
    if token_mask.shape != shape:
        raise ValueError(
            f"token_mask has shape {tuple(token_mask.shape)}, expected {expected} {tuple(shape)}"
        )
    if token_mask.dtype != torch.bool:
        raise ValueError(f"token_mask must be a bool tensor, got dtype {token_mask.dtype}")
