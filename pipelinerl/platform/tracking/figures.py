"""The figures a run (or a comparison of runs) is judged by, drawn from its per-step records.

Pure: records in, a matplotlib ``Figure`` out (Agg backend, nothing shown, nothing written);
the tracking owner logs them to MLflow and ``bench`` saves them under ``docs/``.

* ``lag_histogram``: tokens by lag over the whole run (paper Fig. 2 style);
* ``lag_by_position``: mean lag against token position in the completion (PipelineRL: early
  tokens are older than late ones, because in-flight sequences straddle updates);
* ``learning_curves``: train reward and held-out success against wall time;
* ``ess_by_step``: ESS against policy version;
* ``comparison``: modes overlaid: reward against wall time and samples, ESS and lag by step;
* ``paper_figures``: the paper's four views with modes overlaid: lag against token position, the
  lag histogram, ESS against step and reward against wall time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from pipelinerl.platform.tracking.comparison import DEFAULT_WINDOW, smoothed_rewards  # noqa: E402
from pipelinerl.platform.tracking.metric_registry import (  # noqa: E402
    ESS,
    LAG_BY_POSITION,
    LAG_HISTOGRAM,
    LAG_MEAN,
    LAG_POSITION_BUCKET_SIZE,
    POLICY_VERSION,
    REWARD_MEAN,
    SAMPLES_TRAINED,
    WALL_S,
)

Record = Mapping[str, Any]
EvalPoint = tuple[float, float]  # (wall seconds since training started, held-out success)


def _figure(width: float = 6.0, height: float = 3.6) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def total_lag_histogram(records: Sequence[Record]) -> list[int]:
    """Per-step histograms summed bin by bin (the last bin is the overflow bin)."""
    bins = max((len(r[LAG_HISTOGRAM]) for r in records), default=0)
    total = [0] * bins
    for record in records:
        for lag, count in enumerate(record[LAG_HISTOGRAM]):
            total[lag] += count
    return total


def mean_lag_by_position(records: Sequence[Record]) -> list[float | None]:
    """For each position bucket, the mean over steps of that step's mean lag there."""
    buckets = max((len(r[LAG_BY_POSITION]) for r in records), default=0)
    means: list[float | None] = []
    for bucket in range(buckets):
        values = [
            r[LAG_BY_POSITION][bucket]
            for r in records
            if bucket < len(r[LAG_BY_POSITION]) and r[LAG_BY_POSITION][bucket] is not None
        ]
        means.append(sum(values) / len(values) if values else None)
    return means


def lag_fractions(records: Sequence[Record]) -> list[float]:
    """The run's lag histogram as fractions of its trained tokens, without empty trailing bins."""
    counts = total_lag_histogram(records)
    while len(counts) > 1 and counts[-1] == 0:
        counts = counts[:-1]
    total = sum(counts) or 1
    return [count / total for count in counts]


def early_late_lag(records: Sequence[Record]) -> tuple[float | None, float | None]:
    """Mean lag over the first and over the last quarter of the token positions that have data.

    In PipelineRL the late tokens of a sequence are younger than its early ones (an update lands
    mid-sequence), so the second number is the smaller; in conventional RL the two are equal up
    to noise (every token of a sequence has one version)."""
    means = [m for m in mean_lag_by_position(records) if m is not None]
    if not means:
        return None, None
    quarter = max(1, len(means) // 4)
    return sum(means[:quarter]) / quarter, sum(means[-quarter:]) / quarter


def lag_histogram(records: Sequence[Record], title: str = "") -> Figure:
    figure = _figure()
    axes = figure.add_subplot()
    fractions = lag_fractions(records)
    labels = [str(lag) for lag in range(len(fractions))]
    if labels and len(fractions) == len(total_lag_histogram(records)):
        labels[-1] += "+"  # the overflow bin
    axes.bar(range(len(fractions)), fractions, color="tab:blue")
    axes.set_xticks(range(len(fractions)), labels)
    axes.set_xlabel("lag (policy versions behind the trainer)")
    axes.set_ylabel("fraction of trained tokens")
    axes.set_title(title or "Token lag at train time")
    return figure


def lag_by_position(records: Sequence[Record], title: str = "") -> Figure:
    figure = _figure()
    axes = figure.add_subplot()
    size = records[0][LAG_POSITION_BUCKET_SIZE] if records else 1
    means = mean_lag_by_position(records)
    points = [(bucket * size, mean) for bucket, mean in enumerate(means) if mean is not None]
    axes.plot([p for p, _ in points], [m for _, m in points], marker="o", color="tab:orange")
    axes.set_xlabel("token position in the completion")
    axes.set_ylabel("mean lag")
    axes.set_title(title or "Lag against token position")
    return figure


def learning_curves(records: Sequence[Record], evals: Sequence[EvalPoint], title: str = "") -> Figure:
    figure = _figure()
    axes = figure.add_subplot()
    axes.plot(
        [r[WALL_S] for r in records],
        [r[REWARD_MEAN] for r in records],
        label="train reward",
        alpha=0.7,
    )
    if evals:
        axes.plot([t for t, _ in evals], [s for _, s in evals], "s-", label="held-out success")
    axes.set_xlabel("wall time (s)")
    axes.set_ylabel("success")
    axes.set_ylim(0, 1)
    axes.legend()
    axes.set_title(title or "Learning against wall time")
    return figure


def ess_by_step(records: Sequence[Record], title: str = "") -> Figure:
    figure = _figure()
    axes = figure.add_subplot()
    axes.plot([r[POLICY_VERSION] for r in records], [r[ESS] for r in records], color="tab:green")
    axes.set_xlabel("policy version")
    axes.set_ylabel("ESS")
    axes.set_ylim(0, 1.05)
    axes.set_title(title or "Effective sample size per step")
    return figure


def comparison(runs: Mapping[str, Sequence[Record]], title: str = "", window: int = DEFAULT_WINDOW) -> Figure:
    """One colour per run (keyed by its label): the four panels a comparison is read from.

    Reward panels show each step's train reward faintly and its trailing mean (``window`` steps,
    the curve the comparison's time to target is read from) solid.
    """
    figure = _figure(11.0, 7.0)
    by_time, by_samples, ess, lag = figure.subplots(2, 2).flat
    for index, (label, records) in enumerate(runs.items()):
        color = f"C{index}"
        raw = [r[REWARD_MEAN] for r in records]
        smooth = smoothed_rewards(records, window)
        for axes, x in (
            (by_time, [r[WALL_S] for r in records]),
            (by_samples, [r[SAMPLES_TRAINED] for r in records]),
        ):
            axes.plot(x, raw, color=color, alpha=0.25, linewidth=0.8)
            axes.plot(x, smooth, color=color, label=f"{label} (mean of {window} steps)")
        versions = [r[POLICY_VERSION] for r in records]
        ess.plot(versions, [r[ESS] for r in records], color=color, label=label)
        lag.plot(versions, [r[LAG_MEAN] for r in records], color=color, label=label)
    for axes, xlabel, ylabel in (
        (by_time, "wall time (s)", "train reward"),
        (by_samples, "samples trained", "train reward"),
        (ess, "policy version", "ESS"),
        (lag, "policy version", "mean token lag"),
    ):
        axes.set_xlabel(xlabel)
        axes.set_ylabel(ylabel)
        axes.legend()
    if title:
        figure.suptitle(title)
    return figure


def learning_overlay(
    curves: Mapping[str, Sequence[Sequence[tuple[float, int, float]]]], target: float, title: str = ""
) -> Figure:
    """Held-out success against wall time and against samples: one colour per variant, one line per
    seed, each point a checkpoint ``(wall s, samples, success)``; the target as a dashed line."""
    figure = _figure(11.0, 4.2)
    by_time, by_samples = figure.subplots(1, 2).flat
    for index, (label, seeds) in enumerate(curves.items()):
        for number, points in enumerate(seeds):
            walls, samples, success = zip(*points, strict=True) if points else ((), (), ())
            name = label if number == 0 else None
            by_time.plot(walls, success, marker="o", markersize=3, color=f"C{index}", label=name)
            by_samples.plot(samples, success, marker="o", markersize=3, color=f"C{index}", label=name)
    for axes, xlabel in ((by_time, "wall time (s)"), (by_samples, "samples trained")):
        axes.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:.0%}")
        axes.set_xlabel(xlabel)
        axes.set_ylabel("held-out success")
        axes.legend(fontsize=8)
    if title:
        figure.suptitle(title)
    return figure


def paper_figures(
    runs: Mapping[str, Sequence[Record]], title: str = "", window: int = DEFAULT_WINDOW
) -> Figure:
    """The paper's views of a run, one colour per run (keyed by label): (a) mean lag against token
    position, (b) the lag histogram, (c) ESS against step, (d) train reward against wall time
    (each step faint, the trailing mean of ``window`` steps solid)."""
    figure = _figure(11.0, 7.5)
    by_position, histogram, ess, reward = figure.subplots(2, 2).flat
    width = 0.8 / max(1, len(runs))
    for index, (label, records) in enumerate(runs.items()):
        color = f"C{index}"
        size = records[0][LAG_POSITION_BUCKET_SIZE] if records else 1
        points = [(b * size, m) for b, m in enumerate(mean_lag_by_position(records)) if m is not None]
        by_position.plot([p for p, _ in points], [m for _, m in points], marker=".", color=color, label=label)
        fractions = lag_fractions(records)
        offsets = [lag - 0.4 + width * (index + 0.5) for lag in range(len(fractions))]
        histogram.bar(offsets, fractions, width=width, color=color, label=label)
        versions = [r[POLICY_VERSION] for r in records]
        ess.plot(versions, [r[ESS] for r in records], color=color, label=label)
        walls = [r[WALL_S] for r in records]
        reward.plot(walls, [r[REWARD_MEAN] for r in records], color=color, alpha=0.25, linewidth=0.8)
        reward.plot(
            walls, smoothed_rewards(records, window), color=color, label=f"{label} (mean of {window})"
        )
    for axes, xlabel, ylabel, name in (
        (by_position, "token position in the completion", "mean lag", "(a) lag against token position"),
        (
            histogram,
            "lag (policy versions behind the trainer)",
            "fraction of trained tokens",
            "(b) lag histogram",
        ),
        (ess, "policy version", "ESS", "(c) effective sample size per step"),
        (reward, "wall time (s)", "train reward", "(d) reward against wall time"),
    ):
        axes.set_xlabel(xlabel)
        axes.set_ylabel(ylabel)
        axes.set_title(name, fontsize=10)
        axes.legend(fontsize=8)
    ess.set_ylim(min(0.9, ess.get_ylim()[0]), 1.005)
    if title:
        figure.suptitle(title)
    return figure
