"""The trainer's cycle, the one definition of its derived figures: the throughput and idle fraction
that ``metric_registry`` declares (``throughput/trainer_tokens_per_s``, ``trainer/idle_fraction``) and
the terminal view, MLflow and the dashboard show. Pure arithmetic on a step's record (or on sums over a
window of steps)."""

from __future__ import annotations


def trainer_cycle_s(step_s: float, wait_s: float, broadcast_ms: float) -> float:
    """Seconds of one trainer cycle (or of a window of cycles, given sums): training the step, the
    weight broadcast that follows it, and the wait for the next batch."""
    return step_s + broadcast_ms / 1000 + wait_s


def trainer_tokens_per_s(tokens: float, step_s: float, wait_s: float, broadcast_ms: float) -> float | None:
    """Tokens trained per second of the trainer's cycle: ``tokens / (step_s + broadcast_s + wait_s)``.

    The broadcast counts as time the trainer is busy, not idle: rank 0 gathers and sends the weights
    and no step can start meanwhile, so a slow broadcast lowers throughput and leaves the idle
    fraction alone (the dashboard once left it out of both, which overstated its tokens/s beside
    MLflow's). None for a cycle of no time."""
    cycle = trainer_cycle_s(step_s, wait_s, broadcast_ms)
    return tokens / cycle if cycle > 0 else None


def trainer_idle_fraction(step_s: float, wait_s: float, broadcast_ms: float) -> float | None:
    """The share of the trainer's cycle spent waiting for a batch: ``wait_s / (step_s + broadcast_s +
    wait_s)`` (the broadcast is busy time, see ``trainer_tokens_per_s``). None for no time."""
    cycle = trainer_cycle_s(step_s, wait_s, broadcast_ms)
    return wait_s / cycle if cycle > 0 else None
