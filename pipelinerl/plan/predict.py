"""A configuration's predicted runs, mode beside mode, and a sweep of one setting with its best value.

One place for what ``pipelinerl plan``, the ``plan`` flow and ``rl-run``'s own prediction do: the
config's workload in each mode (``from_config``), on the cluster when one is given (``cluster``: the
engines its actor GPUs make, the trainer costs scaled to its trainer GPUs), simulated
(``simulate``). A sweep varies one setting (``actor_gpus`` on a cluster, or any config setting such
as ``actor.max_in_flight``) and recommends the value with the most samples per second.

Besides the platform's modes, ``colocated`` is the baseline most published comparisons use (the
PipelineRL paper's conventional RL, verl's colocated runs): conventional rounds in which every GPU of
the cluster generates, then every GPU trains (strict rounds, the engines on all of them, the trainer's
costs scaled to all of them).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Literal, get_args

from pipelinerl.plan.cluster import (
    Cluster,
    ClusterError,
    check_fits,
    engines_on,
    hardware_of,
    kv_cache_sequences,
    scaled_costs,
    zero_step_extra_s,
)
from pipelinerl.plan.from_config import bucket_bytes_of, workload_from_config
from pipelinerl.plan.lengths import Lengths, mean_length
from pipelinerl.plan.profile import CostProfile
from pipelinerl.plan.simulate import SimulatedRun, simulate
from pipelinerl.platform.config import PipelineConfig

SWEEP_FORM = (
    "NAME=LOW..HIGH:STEP or NAME=V1,V2,... (NAME: actor_gpus, or a setting such as actor.max_in_flight)"
)
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?::(\d+))?$")
COLOCATED = "colocated"
MAX_SWEEP_VALUES = 256
PlanMode = Literal["pipeline", "conventional", "async", "colocated"]
PLAN_MODES: tuple[str, ...] = get_args(PlanMode)


def predict(
    config: PipelineConfig,
    profile: CostProfile,
    lengths: Lengths,
    modes: list[str],
    prompt_tokens: int,
    cluster: Cluster | None = None,
    seed: int = 0,
) -> dict[str, SimulatedRun]:
    """The run ``config`` describes, simulated in each of ``modes`` (on ``cluster`` when given)."""
    unknown = [mode for mode in modes if mode not in PLAN_MODES]
    if unknown or not modes:
        raise ValueError(
            f"mode {', '.join(unknown) or '(none)'}: the modes planned are {', '.join(PLAN_MODES)}"
        )
    runs: dict[str, SimulatedRun] = {}
    for mode in modes:
        on: Cluster | None = cluster
        if mode == COLOCATED:
            if cluster is None:
                raise ValueError(
                    f"mode {COLOCATED}: every GPU of a cluster generates, then trains; give --cluster"
                )
            on = Cluster(cluster.total, cluster.total, cluster.gpu)
            workload = workload_from_config(config, lengths, prompt_tokens, "conventional")
            workload = replace(workload, train_during_round=False)
        else:
            workload = workload_from_config(config, lengths, prompt_tokens, mode)
        costs = profile.cost_model(bucket_bytes_of(config))
        if on is not None:
            hardware = hardware_of(profile)
            check_fits(hardware, on, config.trainer.zero_stage)
            costs = scaled_costs(costs, hardware, on)
            if profile.transfer is not None:  # the trainer's link: what ZeRO-3's gather goes over
                extra = zero_step_extra_s(
                    hardware, on, config.trainer.zero_stage, profile.transfer.bytes_per_s
                )
                costs = replace(costs, train_base_s=max(0.0, costs.train_base_s + extra))
            held = kv_cache_sequences(
                hardware, on.gpu, config.actor.gpu_memory_utilization, prompt_tokens + mean_length(lengths)
            )
            in_flight = workload.in_flight if held is None else min(workload.in_flight, held)
            workload = replace(workload, engines=engines_on(hardware, on), in_flight=in_flight)
        runs[mode] = simulate(workload, costs, seed)
    return runs


@dataclass(frozen=True)
class Sweep:
    name: str  # actor_gpus, or a config setting's dotted path
    values: tuple[int, ...]


def parse_sweep(text: str) -> Sweep:
    """``actor_gpus=64..112:16`` (64, 80, 96, 112) or ``actor.max_in_flight=16,32,64``."""
    name, equals, values = text.replace(" ", "").partition("=")
    if not equals or not name or not values:
        raise ValueError(f"sweep {text!r}: expected {SWEEP_FORM}")
    if name != "actor_gpus" and not re.fullmatch(r"[a-z_]+\.[a-z_]+", name):
        raise ValueError(f"sweep {text!r}: {name!r} is neither actor_gpus nor a setting SECTION.NAME")
    match = _RANGE.match(values)
    if match:
        low, high, step = int(match.group(1)), int(match.group(2)), int(match.group(3) or 1)
        if step < 1 or high < low:
            raise ValueError(f"sweep {text!r}: LOW..HIGH:STEP needs LOW <= HIGH and STEP >= 1")
        if (high - low) // step + 1 > MAX_SWEEP_VALUES:  # counted before the range is made
            raise ValueError(f"sweep {text!r}: {(high - low) // step + 1} values; at most {MAX_SWEEP_VALUES}")
        numbers = tuple(range(low, high + 1, step))
    else:
        try:
            numbers = tuple(int(value) for value in values.split(","))
        except ValueError:
            raise ValueError(f"sweep {text!r}: whole numbers expected; {SWEEP_FORM}") from None
    if len(numbers) > MAX_SWEEP_VALUES:
        raise ValueError(f"sweep {text!r}: {len(numbers)} values; at most {MAX_SWEEP_VALUES}")
    return Sweep(name, numbers)


@dataclass(frozen=True)
class SweepPoint:
    value: int
    runs: dict[str, SimulatedRun]
    cluster: Cluster | None


def sweep_points(
    sweep: Sweep,
    config_for: Callable[[int | None], PipelineConfig],
    profile: CostProfile,
    lengths: Lengths,
    modes: list[str],
    prompt_tokens: int,
    cluster: Cluster | None,
    seed: int = 0,
) -> Iterator[SweepPoint]:
    """Each value of the sweep predicted in turn (``config_for(value)``: the config with the swept
    setting at that value; None for ``actor_gpus``, which changes the cluster instead)."""
    if sweep.name == "actor_gpus" and cluster is None:
        raise ClusterError("sweep actor_gpus: give the cluster it splits (--cluster actors=...,trainers=...)")
    for value in sweep.values:
        split = cluster.with_actor_gpus(value) if sweep.name == "actor_gpus" and cluster else cluster
        config = config_for(None if sweep.name == "actor_gpus" else value)
        yield SweepPoint(value, predict(config, profile, lengths, modes, prompt_tokens, split, seed), split)


def recommend(points: list[SweepPoint], mode: str, name: str) -> tuple[SweepPoint, str]:
    """The value with the most samples/s in ``mode``, and why: what limits the values around it."""
    best = max(points, key=lambda point: point.runs[mode].samples_per_s)
    run = best.runs[mode]
    reason = (
        f"{name}={best.value}: the most samples/s in {mode} mode ({run.samples_per_s:,.2f}; actors idle "
        f"{run.actor_idle:.2f}, trainer idle {run.trainer_idle:.2f})"
    )
    index = points.index(best)
    if index > 0:
        below = points[index - 1].runs[mode]
        reason += f"; at {points[index - 1].value}: {limit(below)}"
    if index + 1 < len(points):
        above = points[index + 1].runs[mode]
        reason += f"; at {points[index + 1].value}: {limit(above)}"
    return best, reason


def limit(run: SimulatedRun) -> str:
    """What holds a simulated run back, in words."""
    if run.trainer_idle > run.actor_idle:
        return (
            f"the trainer waits for samples {run.trainer_idle:.0%} of the time ({run.samples_per_s:,.2f}/s)"
        )
    return f"the actors wait {run.actor_idle:.0%} of the time ({run.samples_per_s:,.2f}/s)"
