"""A step's statistics over every rank's part (workers/step_statistics.py): the figures of two ranks
together are those of their sequences pooled, and nothing of one rank is counted twice."""

from __future__ import annotations

import numpy as np
import pytest

from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.workers.policy_step import TokenRecord
from pipelinerl.workers.step_statistics import RankStep, step_statistics, version_span


def tokens(versions: list[int], positions: list[int], logprob: float = -1.0) -> TokenRecord:
    n = len(versions)
    return TokenRecord(
        trainer_logprobs=np.full(n, logprob, dtype=np.float32),
        behaviour_logprobs=np.full(n, logprob, dtype=np.float32),
        token_versions=np.asarray(versions, dtype=np.int32),
        token_positions=np.asarray(positions, dtype=np.int32),
        ratio=np.ones(n, dtype=np.float32),
    )


def part(versions: list[list[int]], rewards: list[float], loss: float, groups: list[str]) -> RankStep:
    """A rank that trained one sequence per entry of ``versions`` (each token's version)."""
    return RankStep(
        tokens=tokens([v for seq in versions for v in seq], [i for seq in versions for i in range(len(seq))]),
        rewards=rewards,
        version_spans=[version_span(seq) for seq in versions],
        lengths=[len(seq) for seq in versions],
        loss=loss,
        rollouts=[(f"r-{groups[0]}-{i}", min(seq)) for i, seq in enumerate(versions)],
        results=[(sum(len(seq) for seq in versions), 0.0, 0.0, 0.0, None, None)],
        groups=groups,
    )


def test_two_ranks_pool_their_sequences():
    rank0 = part([[3, 3, 4], [4, 4]], rewards=[1.0, 0.0], loss=0.5, groups=["g1"])
    rank1 = part([[2, 2, 2, 2]], rewards=[1.0], loss=1.5, groups=["g1", "g2"])
    stats = step_statistics([rank0, rank1], trained_at=4, is_cap=None, kl_coef=0.0, entropy_coef=0.0)
    assert stats[registry.TRAINER_SAMPLES] == 3
    assert stats[registry.TRAINER_TOKENS] == 9
    assert stats[registry.LOSS] == pytest.approx(1.0)  # the mean of the ranks' sums
    assert stats[registry.REWARD_MEAN] == pytest.approx(2 / 3)
    # lags from version 4: tokens of v3 lag 1, v2 lag 2, v4 lag 0 -> (2*1 + 4*2) / 9
    assert stats[registry.LAG_MEAN] == pytest.approx(10 / 9)
    assert stats[registry.LAG_MAX] == 2
    assert stats[registry.TRAINER_INFLIGHT_SEQUENCES] == 1  # only [3, 3, 4] was written by two versions
    assert stats[registry.COMPLETION_LEN_MAX] == 4
    assert stats[registry.TRAINED_GROUPS] == ["g1", "g2"]  # a group split over ranks, once
    assert len(stats[registry.ROLLOUTS]) == 3
    assert stats[registry.ESS] == pytest.approx(1.0)  # equal log-probs: every weight 1
    assert registry.ESS_TRUNCATED not in stats  # no cap, no truncated ESS
    assert stats[registry.BEHAVIOUR_MISMATCH] == pytest.approx(0.0)  # lag-0 tokens agree exactly


def test_a_capped_loss_reports_the_truncated_ess_and_a_step_without_fresh_tokens_no_mismatch():
    stale = part([[1, 1]], rewards=[0.0], loss=0.0, groups=["g"])
    stats = step_statistics([stale], trained_at=3, is_cap=2.0, kl_coef=0.0, entropy_coef=0.0)
    assert stats[registry.ESS_TRUNCATED] == pytest.approx(1.0)
    assert registry.BEHAVIOUR_MISMATCH not in stats  # no lag-0 token: absent, not NaN
