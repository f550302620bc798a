"""The ``Workload`` an experiment's config asks for: its mode, engines, H, B, G, steps and queue bounds."""

from __future__ import annotations

from typing import cast

from pipelinerl.plan.lengths import Lengths
from pipelinerl.plan.transfer import MIB
from pipelinerl.plan.workload import SIMULATED_MODES, SimulatedMode, Workload
from pipelinerl.platform.config import PipelineConfig


def workload_from_config(
    config: PipelineConfig, lengths: Lengths, prompt_tokens: int, mode: str | None = None
) -> Workload:
    """The run ``config`` describes (in ``mode`` when given, else its own ``run.mode``).

    The queue a sequence waits in for the trainer holds what the rollout socket holds
    (``transport.queue_size`` messages, one sequence each) and the batches the preprocessor may hand
    out ahead (``transport.batches_ahead``; conventional mode adds the round's G-1); a run that trains
    only once its round is generated holds the whole round."""
    mode = mode or config.run.mode
    if mode not in SIMULATED_MODES:
        raise ValueError(f"mode {mode!r}: the simulator models {', '.join(SIMULATED_MODES)}")
    simulated = cast(SimulatedMode, mode)
    rl, run, transport = config.rl, config.run, config.transport
    rounds = run.steps_per_round if simulated == "conventional" else 1
    capacity = transport.queue_size + (transport.batches_ahead + rounds - 1) * rl.batch_size
    if simulated == "conventional" and not run.train_during_round:
        capacity = max(capacity, rl.batch_size * rounds)
    return Workload(
        mode=simulated,
        engines=config.actor.num_actors,
        in_flight=config.actor.max_in_flight,
        batch_size=rl.batch_size,
        steps=run.max_steps,
        prompt_tokens=prompt_tokens,
        lengths=lengths,
        steps_per_round=rounds,
        group_size=rl.group_size,
        train_during_round=run.train_during_round,
        max_lag=rl.max_lag,
        queue_capacity=capacity,
        batches_ahead=transport.batches_ahead,
        drain_lag=run.async_drain_lag,
        recompute=simulated == "pipeline" and config.actor.kv_cache_on_update == "recompute",
    )


def bucket_bytes_of(config: PipelineConfig) -> int:
    """The largest bucket of a weight update the config asks for (``transport.weight_bucket_mib``)."""
    return config.transport.weight_bucket_mib * MIB
