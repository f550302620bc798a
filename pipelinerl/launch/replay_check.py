"""A replay's steps against the record: what `pipelinerl replay` reports, and the first divergence.

For each replayed version, in the order a step computes them: the token log-probs of its forward pass
and their ratios to the behaviour policy (each rank's ``tokens/step_<version>_rank<r>.npz``), then the
step's loss, ESS and gradient norm (``metrics.jsonl``), then the weights it made, tensor by tensor
(``digests/step_<version>.json``). With ``tolerance`` 0 every value must agree to the bit; otherwise
within ``tolerance``, relative (absolute below 1); the weights' digests always to the bit (report the
tolerance a run needs through the values, not through the weights).

A what-if replay (another recipe on the same batches) is not checked: its values are reported beside
the record's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipelinerl.platform.jsonl import step_records
from pipelinerl.platform.step_digests import first_difference, read_step_digests, step_digests_path
from pipelinerl.platform.tracking import metric_registry as registry

COMPARED = (registry.LOSS, registry.ESS, registry.TRAINER_GRAD_NORM)
TOKEN_ARRAYS = ("trainer_logprobs", "ratio")


@dataclass(frozen=True)
class StepCheck:
    """One replayed version: the compared values of the record and of the replay, and the first thing
    that differs (None: the step agrees, or a what-if replay, which is not checked)."""

    version: int
    recorded: dict[str, float] = field(default_factory=dict)
    replayed: dict[str, float] = field(default_factory=dict)
    difference: str | None = None


@dataclass(frozen=True)
class ReplayReport:
    steps: list[StepCheck]
    tolerance: float
    what_if: bool

    @property
    def first_divergence(self) -> StepCheck | None:
        return next((step for step in self.steps if step.difference is not None), None)


def values_agree(recorded: float, replayed: float, tolerance: float) -> bool:
    if tolerance == 0.0:
        return recorded == replayed or (math.isnan(recorded) and math.isnan(replayed))
    return abs(recorded - replayed) <= tolerance * max(1.0, abs(recorded))


def arrays_difference(name: str, recorded: np.ndarray, replayed: np.ndarray, tolerance: float) -> str | None:
    """How ``replayed`` differs from ``recorded`` (the first element, or the shape); None when they agree."""
    if recorded.shape != replayed.shape:
        return f"{name} has shape {replayed.shape}, recorded {recorded.shape}"
    if tolerance == 0.0:
        same = (recorded == replayed) | (np.isnan(recorded) & np.isnan(replayed))
    else:
        same = np.isclose(recorded, replayed, rtol=tolerance, atol=tolerance, equal_nan=True)
    if bool(np.all(same)):
        return None
    where = int(np.argmin(same))
    return (
        f"{name}[{where}] is {replayed.flat[where]!r}, recorded {recorded.flat[where]!r} "
        f"({int(np.size(same) - np.count_nonzero(same))} of {np.size(same)} differ)"
    )


def _token_data(run_dir: Path, version: int, rank: int) -> dict[str, np.ndarray]:
    path = run_dir / "tokens" / f"step_{version:06d}_rank{rank}.npz"
    with np.load(path) as data:
        return {name: np.asarray(data[name]) for name in TOKEN_ARRAYS if name in data}


def _step_difference(
    source: Path, out: Path, version: int, ranks: int, recorded: dict[str, float], replayed: dict[str, float],
    tolerance: float,
) -> str | None:  # fmt: skip
    for rank in range(ranks):
        theirs, ours = _token_data(source, version, rank), _token_data(out, version, rank)
        for name in TOKEN_ARRAYS:
            if name in theirs and name in ours:
                found = arrays_difference(name, theirs[name], ours[name], tolerance)
                if found is not None:
                    return f"rank {rank}: {found}"
    for name, value in recorded.items():
        if name not in replayed:
            return f"{name} is missing from the replay"
        if not values_agree(value, replayed[name], tolerance):
            return f"{name} is {replayed[name]!r}, recorded {value!r}"
    return first_difference(
        read_step_digests(step_digests_path(source, version)),
        read_step_digests(step_digests_path(out, version)),
    )


def check_replay(
    source: Path, out: Path, versions: range, ranks: int, tolerance: float = 0.0, what_if: bool = False
) -> ReplayReport:
    """Each version of ``versions`` the replay in ``out`` trained, against ``source``'s record."""
    theirs, ours = step_records(source), step_records(out)
    steps = []
    for version in versions:
        if version not in ours:
            steps.append(StepCheck(version, difference=f"the replay recorded no step for version {version}"))
            break
        recorded = {name: float(theirs[version][name]) for name in COMPARED if name in theirs[version]}
        replayed = {name: float(ours[version][name]) for name in COMPARED if name in ours[version]}
        difference = (
            None if what_if else _step_difference(source, out, version, ranks, recorded, replayed, tolerance)
        )
        steps.append(StepCheck(version, recorded, replayed, difference))
    return ReplayReport(steps, tolerance, what_if)
