"""Micro-batch packing: group variable-length sequences into padded rectangles under a token budget.

Role: the trainer pads each micro-batch to ``[num_sequences, longest_length]``, so its memory cost is that
product, not the sum of lengths. Packing sequences of similar length together keeps padding, and so wasted
compute, low.

Invariants: every input index appears in exactly one micro-batch; a micro-batch's cost
``len(micro_batch) * max(lengths of its sequences)`` is within the budget, except a single sequence longer
than the budget, which is placed alone (it cannot be split here; the trainer decides whether to train or drop
it); the result depends only on the inputs (stable sort, no randomness).
"""

from __future__ import annotations

from collections.abc import Sequence


def pack_micro_batches(lengths: Sequence[int], max_tokens_per_micro_batch: int) -> list[list[int]]:
    """Greedy packing of sequence indices into micro-batches of padded cost <= ``max_tokens_per_micro_batch``.

    Indices are visited by length, longest first (ties in index order); each joins the current micro-batch if
    the padded cost stays within the budget, else it opens a new one. Because lengths only decrease, the first
    sequence of a micro-batch is its longest.

    Args:
        lengths: token length (>= 1) of each sequence, indexed by sequence.
        max_tokens_per_micro_batch: budget (>= 1) for ``len(micro_batch) * longest length``.

    Returns:
        micro-batches as lists of indices into ``lengths``, each ordered longest first; ``[]`` for none.
        A sequence longer than the budget gets a micro-batch of its own.
    """
    if max_tokens_per_micro_batch < 1:
        raise ValueError(f"max_tokens_per_micro_batch must be >= 1, got {max_tokens_per_micro_batch}")
    for index, length in enumerate(lengths):
        if length < 1:
            raise ValueError(f"sequence lengths must be >= 1, got length {length} at index {index}")

    # sorted() is stable, so equal lengths keep index order and the packing is deterministic.
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    micro_batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        if current and (len(current) + 1) * lengths[current[0]] > max_tokens_per_micro_batch:
            micro_batches.append(current)
            current = []
        current.append(index)
    if current:
        micro_batches.append(current)
    return micro_batches
