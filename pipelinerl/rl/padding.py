"""Padding a micro-batch: the rectangle the trainer runs, from the sequences ``packing`` grouped.

Role: right-pad token ids into ``[b, T]`` with a mask of the real tokens (``T``: the longest sequence).
Invariants: row ``i`` holds sequence ``i``'s ids, then ``pad_value``; the mask is True exactly on them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_micro_batch(sequences: Sequence[Sequence[int]], pad_value: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token id sequences into a rectangle.

    Args:
        sequences: ``b >= 1`` sequences of token ids.
        pad_value: id written into padding positions.

    Returns:
        ``(input_ids, attention_mask)``: ``[b, T]`` int64 ids and ``[b, T]`` bool mask, True on real tokens,
        where ``T`` is the longest sequence's length.
    """
    if len(sequences) == 0:
        raise ValueError("pad_micro_batch needs at least one sequence, got 0")
    longest = max(len(sequence) for sequence in sequences)
    input_ids = torch.full((len(sequences), longest), pad_value, dtype=torch.int64)
    attention_mask = torch.zeros((len(sequences), longest), dtype=torch.bool)
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence)] = torch.as_tensor(list(sequence), dtype=torch.int64)
        attention_mask[row, : len(sequence)] = True
    return input_ids, attention_mask
