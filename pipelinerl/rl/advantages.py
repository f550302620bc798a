"""Group-relative advantages: the leave-one-out (RLOO) baseline PipelineRL uses.

Role: turn the rewards of G samples of one prompt into per-sample advantages, without a value network.

Invariants: groups are independent rows; every group's advantages sum to 0 (before the optional std
normalisation, and after it too, since it divides a whole row by one positive number).

Reference: Piché et al. 2025, "PipelineRL", arXiv 2509.19128, §"Numbers to implement" (advantage);
Ahmadian et al. 2024, arXiv 2402.14740 (RLOO).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def leave_one_out_advantages(
    rewards: npt.ArrayLike, normalize_std: bool = False, eps: float = 1e-6
) -> npt.NDArray[np.floating]:
    """Leave-one-out advantages within each group of samples of one prompt.

    ``A_i = R_i - mean_{j != i} R_j``, which equals ``G / (G - 1) * (R_i - mean_j R_j)``.

    Args:
        rewards: ``[num_groups, group_size]`` rewards, one row per prompt; ``group_size >= 2``.
        normalize_std: divide each row by (its sample standard deviation, ``correction=1``, + ``eps``);
            off by default, as in the paper.
        eps: keeps the division finite for a group whose rewards are all equal (its advantages are 0).

    Returns:
        ``[num_groups, group_size]`` advantages, floating point (integer rewards are promoted to float32).

    Reference: Piché et al. 2025, arXiv 2509.19128, §"Numbers to implement" (advantage).
    """
    rewards = np.asarray(rewards)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be 2-D [num_groups, group_size], got shape {tuple(rewards.shape)}")
    group_size = rewards.shape[1]
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 for a leave-one-out baseline, got {group_size}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if not np.issubdtype(rewards.dtype, np.floating):
        rewards = rewards.astype(np.float32)

    group_sum = rewards.sum(axis=1, keepdims=True)
    baseline = (group_sum - rewards) / (group_size - 1)
    advantages = rewards - baseline
    if normalize_std:
        advantages = advantages / (rewards.std(axis=1, ddof=1, keepdims=True) + eps)
    return advantages
