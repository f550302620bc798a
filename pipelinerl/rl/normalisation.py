"""Loss normalisation: the number a step's summed policy loss is divided by.

Role: the recipes users compare differ in how they average the per-token terms of a step. The policy losses
(``loss.py``, ``gspo.py``, ``cispo.py``) take that number as their denominator and divide their *sum* by it,
so micro-batch losses add up to the step's whatever the choice; the trainer computes it once per optimizer
step from the whole step's counts (never a micro-batch's).

The choices:

* ``"sequence"``: the step's sequence count, PipelineRL's (the paper's
  ``L = -(1/n_seq) sum_seq sum_t A w log pi``), today's behaviour. A sequence's weight grows with its length.
* ``"token"``: the step's masked-in token count, DAPO's token-level mean (Yu et al. 2025, arXiv 2503.14476,
  §3.3): every token weighs the same, so long sequences are not under-weighted per token.
* ``"constant"``: ``num_sequences * max_new_tokens``, Dr. GRPO's (Liu et al. 2025, "Understanding R1-Zero-Like
  Training", arXiv 2503.20783, §3.1): a constant per step, independent of the lengths sampled, so there is no
  length bias (GRPO's per-sequence ``1/|o_i|`` favours short correct and long wrong answers).

Invariants: the result is a float >= 1; every count must be an integer >= 1, whichever choice uses it.

Pure Python (no torch), so a light process (config validation, the preprocessor) can import it.
"""

from __future__ import annotations

import numbers
from typing import Literal, get_args

__all__ = ["NORMALISATIONS", "Normalisation", "loss_denominator"]

Normalisation = Literal["sequence", "token", "constant"]
NORMALISATIONS: tuple[str, ...] = get_args(Normalisation)


def _count(name: str, value: int, meaning: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer ({meaning}), got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1 ({meaning}), got {value}")
    return int(value)


def loss_denominator(kind: Normalisation, num_sequences: int, num_tokens: int, max_new_tokens: int) -> float:
    """The denominator of a step's policy loss under normalisation ``kind``.

    Args:
        kind: ``"sequence"``, ``"token"`` or ``"constant"`` (see the module docstring).
        num_sequences: the optimizer step's sequence count (all micro-batches together).
        num_tokens: the step's masked-in (trained) token count.
        max_new_tokens: the actor's generation budget per sequence (``actor.max_new_tokens``).

    Returns:
        ``num_sequences``, ``num_tokens`` or ``num_sequences * max_new_tokens`` as a float.

    Raises:
        ValueError: an unknown ``kind`` (naming the valid ones), or a count that is not an integer >= 1.
    """
    if kind not in NORMALISATIONS:
        raise ValueError(f"unknown loss normalisation {kind!r}; valid: {', '.join(NORMALISATIONS)}")
    sequences = _count("num_sequences", num_sequences, "the step's sequence count")
    tokens = _count("num_tokens", num_tokens, "the step's masked-in token count")
    budget = _count("max_new_tokens", max_new_tokens, "the actor's generation budget per sequence")
    if kind == "sequence":
        return float(sequences)
    if kind == "token":
        return float(tokens)
    return float(sequences * budget)
