"""Completion lengths for a simulated run: how many tokens each sequence writes.

* ``FixedLengths``: every sequence the same (the case where the paper's advantage shrinks);
* ``EmpiricalLengths``: drawn from the lengths of a finished run (its token files);
* ``LogNormalLengths``: a lognormal given the mean and the 90th percentile, cut at the longest a run
  allows (``actor.max_new_tokens``; a sequence that reaches it is truncated there, as in a run);
* ``LogLogisticLengths``: a heavier tail (a power law: the share longer than x falls as x^-beta, where a
  lognormal's falls faster than any power), given the median and the 90th percentile, cut the same way:
  reasoning traces, where a few sequences run to the cut while most end early.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Protocol

import numpy as np

Z90 = NormalDist().inv_cdf(0.9)  # the standard normal's 90th percentile


class Lengths(Protocol):
    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """``count`` completion lengths, each at least 1 token."""
        ...

    @property
    def longest(self) -> int:
        """The most tokens a completion can have."""
        ...


@dataclass(frozen=True)
class FixedLengths:
    tokens: int

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ValueError(f"tokens={self.tokens}: a completion has at least 1 token")

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return np.full(count, self.tokens, dtype=np.int64)

    @property
    def longest(self) -> int:
        return self.tokens


@dataclass(frozen=True)
class EmpiricalLengths:
    observed: tuple[int, ...]

    def __init__(self, observed: Sequence[int]) -> None:
        if not observed:
            raise ValueError("observed: give at least one completion length")
        if min(observed) < 1:
            raise ValueError(f"observed: a completion has at least 1 token (got {min(observed)})")
        object.__setattr__(self, "observed", tuple(int(length) for length in observed))

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return rng.choice(np.asarray(self.observed, dtype=np.int64), size=count, replace=True)

    @property
    def longest(self) -> int:
        return max(self.observed)


@dataclass(frozen=True)
class LogNormalLengths:
    """Lognormal with parameters ``mu`` and ``sigma`` (of the log), rounded up, cut at ``max_tokens``."""

    mu: float
    sigma: float
    max_tokens: int

    @classmethod
    def from_mean_p90(cls, mean: float, p90: float, max_tokens: int) -> LogNormalLengths:
        """The lognormal whose mean and 90th percentile (before the cut) are ``mean`` and ``p90``.

        With ``m = ln mean`` and ``q = ln p90``: ``mu + sigma^2/2 = m`` and ``mu + Z90 sigma = q``, so
        ``sigma^2/2 - Z90 sigma + (q - m) = 0``; the smaller root is the distribution's sigma (a p90 above
        the mean needs ``q - m <= Z90^2 / 2``, else no lognormal has both)."""
        if not 0 < mean < p90:
            raise ValueError(f"mean={mean}, p90={p90}: need 0 < mean < p90")
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens}: at least 1")
        gap = math.log(p90) - math.log(mean)
        discriminant = Z90 * Z90 - 2 * gap
        if discriminant < 0:
            limit = mean * math.exp(Z90 * Z90 / 2)
            raise ValueError(
                f"p90={p90} is too far above mean={mean} for a lognormal (at most {limit:.0f} for this mean)"
            )
        sigma = Z90 - math.sqrt(discriminant)
        return cls(mu=math.log(mean) - sigma * sigma / 2, sigma=sigma, max_tokens=max_tokens)

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        drawn = np.ceil(rng.lognormal(self.mu, self.sigma, size=count)).astype(np.int64)
        return np.clip(drawn, 1, self.max_tokens)

    @property
    def longest(self) -> int:
        return self.max_tokens


@dataclass(frozen=True)
class LogLogisticLengths:
    """Log-logistic with scale ``median`` and shape ``beta``, rounded up, cut at ``max_tokens``: its
    quantile at p is ``median * (p / (1 - p)) ** (1 / beta)``, so the share above x falls as x^-beta."""

    median: float
    beta: float
    max_tokens: int

    @classmethod
    def from_median_p90(cls, median: float, p90: float, max_tokens: int) -> LogLogisticLengths:
        """The log-logistic with this median and 90th percentile (before the cut): p90 = median·9^(1/beta)."""
        if not 0 < median < p90:
            raise ValueError(f"median={median}, p90={p90}: need 0 < median < p90")
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens}: at least 1")
        return cls(median=median, beta=math.log(9) / math.log(p90 / median), max_tokens=max_tokens)

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        uniform = rng.uniform(1e-12, 1 - 1e-12, size=count)
        drawn = np.ceil(self.median * (uniform / (1 - uniform)) ** (1 / self.beta))
        return np.clip(np.minimum(drawn, self.max_tokens), 1, self.max_tokens).astype(np.int64)

    @property
    def longest(self) -> int:
        return self.max_tokens


LENGTH_FORMS = (
    "fixed:TOKENS, lognormal:MEAN,P90, loglogistic:MEDIAN,P90 (a heavier tail) or run:RUN_DIR (a "
    "finished run's completions)"
)


def mean_length(lengths: Lengths, draws: int = 4096) -> float:
    """The mean completion length, estimated from a fixed-seed sample (every form of ``Lengths``)."""
    return float(lengths.sample(np.random.default_rng(0), draws).mean())


def parse_lengths(text: str, max_tokens: int) -> Lengths:
    """``fixed:TOKENS``, ``lognormal:MEAN,P90`` or ``loglogistic:MEDIAN,P90`` (cut at ``max_tokens``, the
    run's longest completion);
    ``run:RUN_DIR`` is read by the command (``calibrate.completion_lengths``)."""
    kind, _, values = text.partition(":")
    try:
        numbers = [float(value) for value in values.split(",")] if values else []
    except ValueError:
        raise ValueError(f"lengths {text!r}: numbers expected after the colon ({LENGTH_FORMS})") from None
    if kind == "fixed" and len(numbers) == 1 and numbers[0].is_integer():
        return FixedLengths(min(int(numbers[0]), max_tokens))
    if kind == "lognormal" and len(numbers) == 2:
        return LogNormalLengths.from_mean_p90(numbers[0], numbers[1], max_tokens)
    if kind == "loglogistic" and len(numbers) == 2:
        return LogLogisticLengths.from_median_p90(numbers[0], numbers[1], max_tokens)
    raise ValueError(f"lengths {text!r}: expected {LENGTH_FORMS}")
