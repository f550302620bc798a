"""Pure RL math of PipelineRL (torch only, no I/O): policy losses, advantages, ESS, token lag,
behaviour mismatch, packing.

Reference: Piché et al. 2025, "PipelineRL", arXiv 2509.19128.
"""

from pipelinerl.rl.advantages import leave_one_out_advantages
from pipelinerl.rl.ess import effective_sample_size
from pipelinerl.rl.lag import LagStatistics, lag_statistics, token_lags
from pipelinerl.rl.loss import PolicyLossOutput, ppo_clip_loss, truncated_is_loss
from pipelinerl.rl.mismatch import behaviour_mismatch
from pipelinerl.rl.packing import pack_micro_batches, pad_micro_batch

__all__ = [
    "LagStatistics",
    "PolicyLossOutput",
    "behaviour_mismatch",
    "effective_sample_size",
    "lag_statistics",
    "leave_one_out_advantages",
    "pack_micro_batches",
    "pad_micro_batch",
    "ppo_clip_loss",
    "token_lags",
    "truncated_is_loss",
]
