"""Token lag: how many optimizer steps old the policy that sampled a token is when the token is trained on.

Role: PipelineRL stamps every generated token with the policy version that sampled it (the actor may swap
weights in the middle of a sequence), so lag is a per-token quantity. This module computes the lags of an
optimizer step and the statistics the trainer logs under ``lag/…``: mean, p50, p90, min, max, a histogram and
the mean lag against the token's position in its completion (early tokens of a long sequence are older).

Invariants: lag = trainer version - token version >= 0 (a negative lag means a token from a future policy,
i.e. a bug upstream, and is rejected); statistics are plain Python numbers, so ``to_dict`` is JSON-able.

Reference: Piché et al. 2025, "PipelineRL", arXiv 2509.19128, §"Numbers to implement" (policy version, lag).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class LagStatistics:
    """Lag statistics of the tokens of one optimizer step.

    Attributes:
        num_tokens: number of tokens summarised.
        mean, p50, p90: mean and percentiles (linear interpolation, as ``numpy.percentile(method="linear")``).
        max, min: largest and smallest lag.
        histogram: ``histogram[k]`` counts tokens with lag ``k`` for ``k < len(histogram) - 1``; the last bin
            counts every lag ``>= len(histogram) - 1``.
        mean_by_position: entry ``b`` is the mean lag of tokens whose 0-based position in their
            completion satisfies ``position // position_bucket_size == b``; buckets run up to the largest
            position present, and an empty bucket is ``None``.
        position_bucket_size: width of a position bucket in tokens.
    """

    num_tokens: int
    mean: float
    p50: float
    p90: float
    max: int
    min: int
    histogram: list[int]
    mean_by_position: list[float | None]
    position_bucket_size: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field."""
        return dataclasses.asdict(self)


def token_lags(trainer_version: int, token_versions: torch.Tensor) -> torch.Tensor:
    """Per-token lag ``trainer_version - token_versions``.

    Args:
        trainer_version: the trainer's policy version at the optimizer step that trains the tokens.
        token_versions: ``[*]`` integer policy version that sampled each token.

    Returns:
        ``[*]`` int64 lags, all >= 0.

    Raises:
        ValueError: ``token_versions`` is not an integer tensor, or a token's version exceeds
            ``trainer_version`` (a token from the future).

    Reference: Piché et al. 2025, arXiv 2509.19128, §"Numbers to implement" (lag of a token).
    """
    if token_versions.is_floating_point() or token_versions.dtype == torch.bool:
        raise ValueError(f"token_versions must be an integer tensor, got dtype {token_versions.dtype}")
    lags = trainer_version - token_versions.to(torch.int64)
    if lags.numel() > 0 and int(lags.min().item()) < 0:
        newest_version = int(token_versions.max().item())
        raise ValueError(
            f"a token has policy version {newest_version}, "
            f"newer than the trainer's version {trainer_version}; lags must be >= 0"
        )
    return lags


def _linear_percentile(sorted_values: torch.Tensor, percentile: float) -> float:
    """Percentile of an ascending 1-D tensor, computed as ``numpy.percentile(..., method="linear")`` does."""
    virtual_index = percentile / 100 * (sorted_values.numel() - 1)
    lower_index = math.floor(virtual_index)
    upper_index = min(lower_index + 1, sorted_values.numel() - 1)
    fraction = virtual_index - lower_index
    lower = float(sorted_values[lower_index].item())
    upper = float(sorted_values[upper_index].item())
    # numpy's _lerp: interpolate from the nearer end, which is exact at fraction 0 and 1.
    if fraction >= 0.5:
        return upper - (upper - lower) * (1 - fraction)
    return lower + (upper - lower) * fraction


def lag_statistics(
    token_lags: torch.Tensor,
    token_positions: torch.Tensor,
    histogram_bins: int = 16,
    position_bucket_size: int = 8,
) -> LagStatistics:
    """Summarise the lags of one optimizer step's tokens.

    Args:
        token_lags: ``[*]`` non-negative integer lags of the trained tokens (masked-out tokens removed).
        token_positions: ``[*]`` 0-based index of each token within its completion, same shape.
        histogram_bins: number of histogram bins (>= 1); the last one is the overflow bin.
        position_bucket_size: width in tokens of a position bucket (>= 1).

    Returns:
        :class:`LagStatistics`.

    Raises:
        ValueError: no tokens, shapes differ, non-integer or negative inputs, or a parameter < 1.

    Reference: Piché et al. 2025, arXiv 2509.19128, §"Numbers to implement" (report mean, p50, p90 and max
    per step, and lag against token position).
    """
    if token_positions.shape != token_lags.shape:
        raise ValueError(
            f"token_positions has shape {tuple(token_positions.shape)}, "
            f"expected the shape of token_lags {tuple(token_lags.shape)}"
        )
    for name, tensor in (("token_lags", token_lags), ("token_positions", token_positions)):
        if tensor.is_floating_point() or tensor.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got dtype {tensor.dtype}")
    if histogram_bins < 1:
        raise ValueError(f"histogram_bins must be >= 1, got {histogram_bins}")
    if position_bucket_size < 1:
        raise ValueError(f"position_bucket_size must be >= 1, got {position_bucket_size}")
    lags = token_lags.reshape(-1).to(torch.int64)
    positions = token_positions.reshape(-1).to(torch.int64)
    if lags.numel() == 0:
        raise ValueError("lag_statistics needs at least one token, got 0")
    min_lag = int(lags.min().item())
    if min_lag < 0:
        raise ValueError(f"token_lags must be >= 0, got a lag of {min_lag}")
    min_position = int(positions.min().item())
    if min_position < 0:
        raise ValueError(f"token_positions must be >= 0, got a position of {min_position}")

    sorted_lags = torch.sort(lags).values
    histogram = torch.bincount(torch.clamp(lags, max=histogram_bins - 1), minlength=histogram_bins)

    buckets = positions // position_bucket_size
    num_buckets = int(buckets.max().item()) + 1
    bucket_counts = torch.bincount(buckets, minlength=num_buckets)
    bucket_sums = torch.bincount(buckets, weights=lags.to(torch.float64), minlength=num_buckets)
    mean_by_position: list[float | None] = [
        float(total) / int(count) if int(count) > 0 else None
        for total, count in zip(bucket_sums.tolist(), bucket_counts.tolist(), strict=True)
    ]

    return LagStatistics(
        num_tokens=lags.numel(),
        mean=float(lags.to(torch.float64).mean().item()),
        p50=_linear_percentile(sorted_lags, 50),
        p90=_linear_percentile(sorted_lags, 90),
        max=int(sorted_lags[-1].item()),
        min=min_lag,
        histogram=[int(count) for count in histogram.tolist()],
        mean_by_position=mean_by_position,
        position_bucket_size=position_bucket_size,
    )
