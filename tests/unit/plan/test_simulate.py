"""The simulator on cases whose answers are known in closed form (``plan/simulate.py``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipelinerl.plan.costs import CostModel
from pipelinerl.plan.lengths import FixedLengths, LogNormalLengths
from pipelinerl.plan.simulate import _Engine, simulate, written_by
from pipelinerl.plan.workload import Workload


def workload(**settings) -> Workload:
    base = dict(
        mode="pipeline",
        engines=1,
        in_flight=1,
        batch_size=1,
        steps=20,
        prompt_tokens=0,
        lengths=FixedLengths(10),
    )
    return Workload(**{**base, **settings})


def test_an_actor_bound_run_trains_one_sequence_per_sequence_time() -> None:
    """One engine, one slot, sequences of 10 tokens at 0.1 s a step, a trainer that takes no time: a
    sample a second, and each sequence is written by the version of the sample before it only."""
    run = simulate(workload(), CostModel(decode_base_s=0.1))
    assert run.seconds == pytest.approx(20.0)
    assert run.samples_per_s == pytest.approx(1.0)
    assert run.tokens_per_s == pytest.approx(10.0)
    assert run.lag_tokens == {0: 200}  # each update arrives between two sequences
    assert run.multi_version_sequences == 0
    assert run.actor_idle == pytest.approx(0.0)
    assert run.trainer_idle == pytest.approx(1.0)


def test_a_trainer_bound_run_trains_a_batch_per_step_and_transfer() -> None:
    """Fast engines, a 1 s step and a 0.5 s transfer after every step but the last: B samples per
    1.5 s, from the moment the first batch is ready."""
    costs = CostModel(decode_base_s=0.001, train_base_s=1.0, transfer_s=0.5)
    run = simulate(workload(in_flight=64, batch_size=4, steps=10), costs)
    first_batch = 10 * 0.001
    assert run.seconds == pytest.approx(first_batch + 10 * 1.0 + 9 * 0.5)
    assert run.samples_per_s == pytest.approx(40 / run.seconds)
    assert run.trainer_idle == pytest.approx(first_batch / run.seconds)
    assert run.actor_idle > 0.9  # blocked by the full queue nearly all the time


def test_a_conventional_run_generates_a_round_then_takes_its_g_steps() -> None:
    """B=2, G=4, one engine holding the whole round of 8: generation 1 s, four 0.5 s steps, a 0.2 s
    transfer, twice (no transfer after the last step): 6.2 s. Step g of a round trains lag g."""
    costs = CostModel(decode_base_s=0.1, train_base_s=0.5, transfer_s=0.2)
    run = simulate(
        workload(mode="conventional", in_flight=8, batch_size=2, steps_per_round=4, steps=8), costs
    )
    assert run.seconds == pytest.approx(6.2)
    assert run.samples_per_s == pytest.approx(16 / 6.2)
    assert run.lag_tokens == {0: 40, 1: 40, 2: 40, 3: 40}
    assert (run.lag_mean, run.lag_p90, run.lag_max) == (pytest.approx(1.5), 3, 3)
    assert run.trainer_idle == pytest.approx(2.0 / 6.2)  # 0-1 s and 3.2-4.2 s
    assert run.actor_idle == pytest.approx(4.2 / 6.2)  # 1-3.2 s and 4.2-6.2 s
    assert run.multi_version_sequences == 0 and run.actor_paused == 0.0


def test_training_during_the_round_overlaps_its_first_steps() -> None:
    """Sequences of two lengths: with train_during_round the first batch (the short ones) trains while
    the long ones are written, so the round ends sooner than generation-then-training."""
    costs = CostModel(decode_base_s=0.1, train_base_s=0.5)

    class TwoLengths:  # 5, 20, 5, 20, ... in the order drawn
        drawn = 0
        longest = 20

        def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
            lengths = [5 if (self.drawn + i) % 2 == 0 else 20 for i in range(count)]
            self.drawn += count
            return np.array(lengths)

    settings: dict[str, object] = dict(
        mode="conventional", in_flight=4, batch_size=2, steps_per_round=2, steps=2
    )
    after = simulate(workload(**settings, lengths=TwoLengths()), costs)
    during = simulate(workload(**settings, lengths=TwoLengths(), train_during_round=True), costs)
    assert after.seconds == pytest.approx(2.0 + 2 * 0.5)
    assert during.seconds == pytest.approx(2.0 + 0.5)  # the short pair trained from 0.5 s to 1.0 s


def test_in_flight_updates_write_sequences_with_several_versions_and_cost_pauses() -> None:
    costs = CostModel(decode_base_s=0.1, train_base_s=0.25, update_pause_s=0.05)
    run = simulate(workload(in_flight=4, batch_size=4, steps=30), costs)
    assert sum(run.lag_tokens.values()) == 30 * 4 * 10
    assert run.multi_version_sequences > 0 and run.lag_max >= 1
    # every update but the last publication's is taken in once by the engine, 0.05 s each
    assert 0 < run.actor_paused * run.seconds <= 29 * 0.05 + 1e-9


def test_max_lag_zero_trains_only_tokens_of_the_current_version() -> None:
    costs = CostModel(decode_base_s=0.01, train_base_s=0.1)
    run = simulate(workload(in_flight=8, batch_size=2, steps=10, lengths=FixedLengths(5), max_lag=0), costs)
    assert run.lag_tokens == {0: 10 * 2 * 5}
    assert run.dropped_stale > 0


def test_a_decode_run_costs_the_sum_of_its_steps_and_steps_within_inverts_it() -> None:
    costs = CostModel(decode_base_s=0.01, decode_per_sequence_s=0.002, decode_per_context_token_s=1e-5)
    in_flight, context = 8, 300
    total, step_ends = 0.0, []
    for step in range(50):
        total += costs.decode_step_s(in_flight, context + step * in_flight)
        step_ends.append(total)
    assert costs.decode_steps_s(50, in_flight, context) == pytest.approx(total)
    assert costs.steps_within(step_ends[19] + 1e-9, in_flight, context, 50) == 20
    assert costs.steps_within(step_ends[19] - 1e-9, in_flight, context, 50) == 19
    assert costs.steps_within(1e9, in_flight, context, 50) == 50


def test_a_lognormal_from_mean_and_p90_has_them() -> None:
    lengths = LogNormalLengths.from_mean_p90(mean=1000, p90=2000, max_tokens=10**9)
    drawn = lengths.sample(np.random.default_rng(0), 400_000)
    assert drawn.mean() == pytest.approx(1000, rel=0.02)
    assert np.percentile(drawn, 90) == pytest.approx(2000, rel=0.02)
    capped = LogNormalLengths.from_mean_p90(mean=1000, p90=2000, max_tokens=1500)
    assert capped.sample(np.random.default_rng(0), 1000).max() == 1500


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"engines": 0}, "engines=0"),
        ({"batch_size": 6, "group_size": 4}, "batch_size=6: a multiple of group_size=4"),
        ({"in_flight": 0}, "in_flight=0"),
        ({"mode": "sync"}, "mode='sync'"),
        ({"mode": "async", "group_size": 2, "batch_size": 2}, "group_size=2 above in_flight=1"),
        ({"mode": "conventional", "recompute": True}, "recompute with mode='conventional'"),
        ({"mode": "async", "drain_lag": 0}, "drain_lag=0"),
        ({"batch_size": 4, "queue_capacity": 2}, "queue_capacity=2"),
        ({"mode": "conventional", "steps_per_round": 4, "max_lag": 1}, "max_lag=1"),
        (
            {"mode": "conventional", "batch_size": 2, "steps_per_round": 4, "queue_capacity": 4},
            "queue_capacity=4",
        ),
    ],
)
def test_bad_workloads_are_refused_naming_the_value(settings, named) -> None:
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        workload(**settings)


def test_bad_costs_and_lengths_are_refused_naming_the_value() -> None:
    with pytest.raises(ValueError, match="transfer_s=-1"):
        CostModel(decode_base_s=0.1, transfer_s=-1)
    with pytest.raises(ValueError, match="decode_base_s"):
        CostModel(decode_base_s=0.0)
    with pytest.raises(ValueError, match="p90=10000 is too far above mean=100"):
        LogNormalLengths.from_mean_p90(mean=100, p90=10000, max_tokens=8192)
    with pytest.raises(ValueError, match="tokens=0"):
        FixedLengths(0)


def test_a_group_is_trained_once_its_slowest_sample_has_finished() -> None:
    """Groups of 2 drawn as (5, 20) tokens, one group in flight (H=2): every group waits for its
    20-token sample, 2 s at 0.1 s a step, so a batch of one group every 2 s; every token at lag 0."""

    class ShortThenLong:
        longest = 20

        def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
            return np.array([5, 20][:count])

    costs = CostModel(decode_base_s=0.1)
    run = simulate(workload(in_flight=2, batch_size=2, group_size=2, steps=5, lengths=ShortThenLong()), costs)
    assert run.seconds == pytest.approx(10.0)
    assert run.lag_tokens == {0: 5 * 25}
    assert run.actor_idle == pytest.approx(0.0)


def test_the_steady_figures_start_at_the_first_step() -> None:
    """The trainer-bound run above: after its first step, B samples per step and transfer exactly, and
    the trainer never waits."""
    costs = CostModel(decode_base_s=0.001, train_base_s=1.0, transfer_s=0.5)
    run = simulate(workload(in_flight=64, batch_size=4, steps=10), costs)
    assert run.steady_samples_per_s == pytest.approx(9 * 4 / (9 * 1.5))
    assert run.steady_trainer_idle == pytest.approx(0.0)


def test_batches_built_ahead_are_chosen_a_step_before_they_train() -> None:
    """A trainer-bound run: each batch built ahead waits a step longer, so its tokens are older by
    about a version per batch allowed ahead; the throughput is the trainer's either way."""
    costs = CostModel(decode_base_s=0.01, train_base_s=1.0, transfer_s=0.1)
    runs = [
        simulate(workload(in_flight=8, batch_size=4, steps=30, batches_ahead=ahead, queue_capacity=64), costs)
        for ahead in (1, 2, 3)
    ]
    assert runs[0].lag_mean < runs[1].lag_mean < runs[2].lag_mean
    assert runs[0].steady_samples_per_s == pytest.approx(runs[2].steady_samples_per_s)


def test_a_sequence_s_tokens_are_split_by_the_versions_the_engine_loaded_meanwhile() -> None:
    engine = _Engine(timeline_at=[0, 10, 10, 25], timeline=[0, 1, 2, 3])  # v1 replaced at once by v2
    assert written_by(engine, 5, 30) == [[0, 5], [2, 15], [3, 5]]
    assert written_by(engine, 10, 20) == [[2, 10]]
    assert written_by(engine, 26, 27) == [[3, 1]]


def test_async_mode_drains_before_it_loads_and_never_writes_a_sequence_with_two_versions() -> None:
    """One slot, 1 s sequences, a 0.3 s step, a 0.2 s pause, drain_lag 1. Version 1 arrives at 1.3 s
    while B is written: B goes on under version 0 and is trained at version 1; the engine loads when B
    is done (2.0-2.2 s), then writes C under version 1, trained at version 2 at 3.2-3.5 s. Version 2
    (published at 2.3 s) is loaded when C is done: two pauses in the 3.5 s."""
    costs = CostModel(decode_base_s=0.1, train_base_s=0.3, update_pause_s=0.2)
    run = simulate(workload(mode="async", steps=3), costs)
    assert run.seconds == pytest.approx(3.5)
    assert run.lag_tokens == {0: 10, 1: 20}
    assert run.multi_version_sequences == 0
    assert run.actor_paused * run.seconds == pytest.approx(0.4)
    never = simulate(workload(mode="async", steps=4, drain_lag=100), CostModel(decode_base_s=0.1))
    assert never.lag_tokens == {0: 10, 1: 10, 2: 10, 3: 10}, (
        "never drained: the lag grows by a version a step"
    )
    assert never.actor_paused == 0.0


def test_recompute_prefills_the_tokens_in_flight_again_at_every_update() -> None:
    """The same run in pipeline mode: each update lands 3 tokens into a sequence (B, then C), which the
    engine takes in between two decode steps: 0.2 s of pause, and with recompute 3 tokens of prefill at
    0.01 s more. The lag by position: the first 3 tokens of B and C at lag 1, the rest at 0."""
    costs = CostModel(decode_base_s=0.1, train_base_s=0.3, update_pause_s=0.2, prefill_per_token_s=0.01)
    kept = simulate(workload(steps=3), costs)
    recomputed = simulate(workload(steps=3, recompute=True), costs)
    assert kept.seconds == pytest.approx(3.7) and kept.actor_paused * kept.seconds == pytest.approx(0.4)
    assert recomputed.seconds == pytest.approx(3.76)
    assert recomputed.actor_paused * recomputed.seconds == pytest.approx(0.46)
    assert recomputed.lag_tokens == kept.lag_tokens == {0: 24, 1: 6}
    assert recomputed.lag_by_position == [(p, pytest.approx(2 / 3 if p < 3 else 0.0)) for p in range(10)]


def test_lag_by_position_spans_the_longest_completion_in_ten() -> None:
    """Sequences of one length under in-flight updates: a sequence's first tokens were written by the
    oldest weights it saw, so at fixed length the lag falls with the position."""
    costs = CostModel(decode_base_s=0.01, train_base_s=0.5)
    run = simulate(workload(in_flight=8, batch_size=8, steps=10, lengths=FixedLengths(95)), costs)
    assert [first for first, _ in run.lag_by_position] == list(range(0, 95, 10))
    lags = [lag for _, lag in run.lag_by_position]
    assert lags == sorted(lags, reverse=True) and lags[0] > lags[-1], "later tokens, newer versions"


def test_async_mode_publishes_after_every_step_so_its_lag_stays_bounded() -> None:
    """Each step's weights are published (the trainer held for the transfer each time) and an engine
    drains to load them once it is drain_lag behind: the lag does not grow with the run's length (it
    did when only the first step was published, and max_lag then dropped everything, forever)."""
    costs = CostModel(decode_base_s=0.1, train_base_s=0.3, transfer_s=0.2, update_pause_s=0.05)
    settings: dict[str, object] = dict(mode="async", in_flight=4, batch_size=2, drain_lag=1)
    run = simulate(workload(steps=40, **settings), costs)
    longer = simulate(workload(steps=80, **settings), costs)
    assert run.lag_max == longer.lag_max <= 3, (run.lag_tokens, longer.lag_tokens)
    assert run.seconds >= 40 * 0.3 + 39 * 0.2  # every step and every publication hold the trainer
    bounded = simulate(
        workload(mode="async", steps=40, in_flight=4, batch_size=2, drain_lag=3, max_lag=3), costs
    )
    assert bounded.lag_max <= 3 and bounded.samples == 80


def test_stages_sharing_cores_each_go_faster_while_the_other_waits() -> None:
    """The decode and step costs are as measured with the other stage busy. Actor alone 0.5: A's 10
    steps take 0.05 s each while the trainer waits (0.5 s); B's first 3 go at 0.1 s while A trains
    (0.5-0.8 s), its last 7 at 0.05 s once the trainer stops (0.8-1.15 s); B trains 1.15-1.45 s.
    Trainer alone 0.5, conventional rounds of one: each 0.3 s step takes 0.15 s, no engine decoding."""
    actor = CostModel(decode_base_s=0.1, train_base_s=0.3, actor_alone_speedup=0.5)
    assert simulate(workload(steps=2), actor).seconds == pytest.approx(1.45)
    assert simulate(workload(steps=2), replace(actor, actor_alone_speedup=0.0)).seconds == pytest.approx(2.3)
    trainer = CostModel(decode_base_s=0.1, train_base_s=0.3, trainer_alone_speedup=0.5)
    assert simulate(workload(mode="conventional", steps=2), trainer).seconds == pytest.approx(2.3)
    with pytest.raises(ValueError, match="actor_alone_speedup=1.0: a share of the time saved, below 1"):
        CostModel(decode_base_s=0.1, actor_alone_speedup=1.0)


def test_a_trainer_whose_steps_spread_keeps_its_mean_pace_and_lengthens_the_lag_tail() -> None:
    """Steps drawn around 1 s (a lognormal of mean 1, the profile's spread): over 400 steps the run takes
    about as long as with every step at 1 s, its steps are not all alike, and a slow step's backlog
    shows as a longer worst lag (the queue fills while it trains)."""
    costs = CostModel(decode_base_s=0.004, train_base_s=1.0, transfer_s=0.1)
    steady = simulate(workload(in_flight=8, batch_size=4, steps=400), costs)
    spread = simulate(workload(in_flight=8, batch_size=4, steps=400), replace(costs, train_step_log_sd=0.3))
    assert spread.seconds == pytest.approx(steady.seconds, rel=0.05)
    assert spread.seconds != steady.seconds
    assert spread.lag_max >= steady.lag_max
    assert simulate(workload(steps=30), replace(costs, train_step_log_sd=0.3), seed=3) == simulate(
        workload(steps=30), replace(costs, train_step_log_sd=0.3), seed=3
    ), "seeded: the same seed, the same run"
