"""The actor's admission and drain decisions (``workers/admission.py``), mode by mode, with the edge
cases that otherwise only minute-long runs reach."""

from __future__ import annotations

import pytest

from pipelinerl.platform.config import load_config
from pipelinerl.workers.admission import (
    ContinuousAdmission,
    ConventionalRound,
    continuous_admission,
    conventional_round,
    groups_that_fit,
    loads_on_receipt,
    round_groups,
    runs_rounds,
    wait_over,
)
from pipelinerl.workers.evaluation import EvalSchedule


@pytest.mark.parametrize(
    ("overrides", "rounds", "on_receipt"),
    [
        (["run.mode=pipeline"], False, True),
        (["run.mode=async"], False, False),
        (["run.mode=conventional"], True, True),
        # Strict rounds (generation, then training) are the preprocessor's: the actor runs them alike.
        (["run.mode=conventional", "run.train_during_round=false"], True, True),
    ],
)
def test_each_mode_runs_its_loop_and_loads_when_it_should(overrides, rounds, on_receipt):
    mode = load_config(None, overrides).run.mode
    assert runs_rounds(mode) is rounds
    assert loads_on_receipt(mode) is on_receipt


@pytest.mark.parametrize(
    ("in_flight", "capacity", "group_size", "expected"),
    [(0, 32, 4, 8), (28, 32, 4, 1), (29, 32, 4, 0), (0, 10, 4, 2), (32, 32, 4, 0), (40, 32, 4, 0)],
)
def test_whole_groups_that_fit(in_flight, capacity, group_size, expected):
    assert groups_that_fit(in_flight, capacity, group_size) == expected


# ----- pipeline -----


def test_pipeline_keeps_h_in_flight_a_group_at_a_time_and_never_drains():
    admission = continuous_admission(load_config(None, ["actor.max_in_flight=10", "rl.group_size=4"]))
    assert admission == ContinuousAdmission(max_in_flight=10, group_size=4, drain_lag=None)
    assert admission.groups_to_admit(0) == 2, "8 of 10 slots: a third group would make 12"
    assert admission.groups_to_admit(6) == 1
    assert admission.groups_to_admit(7) == 0
    # The weights thread loads every update: however far the staged weights are ahead, no drain here.
    assert admission.load_now(staged_version=9, engine_version=0, in_flight=0) is False
    assert admission.draining is False
    assert admission.eval_may_start() is True
    assert admission.groups_to_admit(0) == 2


def test_an_eval_round_beyond_h_holds_train_groups_back_until_it_finishes():
    admission = ContinuousAdmission(max_in_flight=8, group_size=4)
    assert admission.groups_to_admit(8 + 20) == 0  # 20 eval samples on top of a full engine
    assert admission.groups_to_admit(5) == 0
    assert admission.groups_to_admit(4) == 1


# ----- async -----


def test_async_takes_its_drain_lag_from_run_async_drain_lag():
    config = load_config(None, ["run.mode=async", "run.async_drain_lag=3", "actor.max_in_flight=16"])
    assert continuous_admission(config) == ContinuousAdmission(max_in_flight=16, group_size=4, drain_lag=3)


def test_async_drain_starts_exactly_at_the_lag():
    below = ContinuousAdmission(max_in_flight=8, group_size=4, drain_lag=2)
    assert below.load_now(staged_version=4, engine_version=3, in_flight=8) is False  # 1 behind
    assert below.draining is False and below.groups_to_admit(4) == 1

    at = ContinuousAdmission(max_in_flight=8, group_size=4, drain_lag=2)
    assert at.load_now(staged_version=5, engine_version=3, in_flight=8) is False  # 2 behind: drain
    assert at.draining is True
    assert at.groups_to_admit(4) == 0 and at.groups_to_admit(0) == 0
    assert at.eval_may_start() is False


def test_async_drain_is_over_when_nothing_is_in_flight_then_it_loads_once_and_admits_again():
    admission = ContinuousAdmission(max_in_flight=8, group_size=4, drain_lag=1)
    assert admission.load_now(staged_version=1, engine_version=0, in_flight=8) is False
    # Sequences finish; a newer update arrives meanwhile: still draining, and it is that one that loads.
    assert admission.load_now(staged_version=1, engine_version=0, in_flight=3) is False
    assert admission.load_now(staged_version=2, engine_version=0, in_flight=1) is False
    assert admission.draining is True
    assert admission.load_now(staged_version=2, engine_version=0, in_flight=0) is True
    assert admission.draining is False
    assert admission.eval_may_start() is True and admission.groups_to_admit(0) == 2
    # Loaded (the engine runs 2 now): nothing more to do until the next update.
    assert admission.load_now(staged_version=2, engine_version=2, in_flight=8) is False
    assert admission.draining is False


def test_async_staged_weights_behind_the_engine_never_start_a_drain():
    admission = ContinuousAdmission(max_in_flight=8, group_size=4, drain_lag=1)
    # Nothing received yet (-1) against a run resumed at version 5; then an older notice (3).
    for staged in (-1, 3, 5):
        assert admission.load_now(staged_version=staged, engine_version=5, in_flight=0) is False
        assert admission.draining is False
        assert admission.groups_to_admit(0) == 2


def test_an_eval_round_due_while_draining_waits_for_the_load():
    """The loop asks ``eval_may_start`` before the schedule, so a round due during a drain stays due."""
    admission = ContinuousAdmission(max_in_flight=8, group_size=4, drain_lag=2)
    schedule = EvalSchedule(every=2, start_version=0)
    submitted: list[int] = []

    def turn(staged: int, engine: int, in_flight: int) -> int:
        """One turn of ``Actor.run_pipeline``; returns the engine's version after it."""
        if admission.load_now(staged, engine, in_flight):
            engine = staged
        if admission.eval_may_start() and schedule.due(engine):
            submitted.append(engine)
        return engine

    assert turn(staged=1, engine=0, in_flight=8) == 0 and submitted == []
    assert turn(staged=2, engine=0, in_flight=8) == 0 and admission.draining
    assert turn(staged=2, engine=0, in_flight=4) == 0 and submitted == []
    assert turn(staged=2, engine=0, in_flight=0) == 2
    assert submitted == [2], "the round due at v2 goes right after v2 loads"


# ----- conventional -----


def test_a_round_holds_g_steps_of_batches():
    assert round_groups(steps_per_round=4, batch_size=32, group_size=4) == 32
    config = load_config(
        None, ["run.mode=conventional", "run.steps_per_round=2", "rl.batch_size=16", "rl.group_size=8"]
    )
    this_round = conventional_round(config, start_version=6)
    assert this_round == ConventionalRound(
        start_version=6, steps=2, groups_left=4, max_in_flight=32, group_size=8
    )
    assert this_round.next_version == 8


def test_a_round_resumed_inside_a_round_ends_where_the_trainer_publishes():
    """A checkpoint at v7 with G=4 (the trainer publishes v8, v12, ...): the first round generates the one
    step up to v8 and waits for it, not for v11, which is never published."""
    config = load_config(
        None, ["run.mode=conventional", "run.steps_per_round=4", "rl.batch_size=16", "rl.group_size=8"]
    )
    first = conventional_round(config, start_version=7)
    assert (first.steps, first.groups_left, first.next_version) == (1, 2, 8)
    assert conventional_round(config, start_version=5).next_version == 8
    assert conventional_round(config, start_version=8).next_version == 12


def test_a_round_admits_what_fits_and_its_last_group_waits_for_room():
    this_round = ConventionalRound(start_version=0, steps=1, groups_left=3, max_in_flight=10, group_size=4)
    assert this_round.groups_to_admit(0) == 2 and this_round.groups_left == 1
    assert this_round.groups_to_admit(8) == 0 and this_round.groups_left == 1  # 12 > 10
    assert this_round.generating(in_flight=8, stop_requested=False)
    assert this_round.groups_to_admit(6) == 1 and this_round.groups_left == 0  # exactly 10
    assert this_round.groups_to_admit(0) == 0
    assert not this_round.over(in_flight=1)
    assert this_round.over(in_flight=0)
    assert not this_round.generating(in_flight=0, stop_requested=False)


def test_a_round_admits_no_more_groups_than_it_has_left():
    this_round = ConventionalRound(start_version=0, steps=4, groups_left=3, max_in_flight=32, group_size=4)
    assert this_round.groups_to_admit(0) == 3
    assert this_round.groups_left == 0


def test_a_group_larger_than_h_goes_alone():
    """G > H: at most max(H, G) in flight, so each group is generated on its own, never none."""
    this_round = ConventionalRound(start_version=0, steps=1, groups_left=3, max_in_flight=2, group_size=4)
    assert this_round.groups_to_admit(0) == 1
    assert this_round.groups_to_admit(4) == 0
    assert this_round.groups_to_admit(1) == 0
    assert this_round.groups_to_admit(0) == 1
    assert this_round.groups_to_admit(0) == 1
    assert this_round.groups_left == 0


def test_a_round_is_not_over_while_its_eval_sequences_are_in_flight():
    this_round = ConventionalRound(start_version=0, steps=1, groups_left=1, max_in_flight=8, group_size=4)
    assert this_round.groups_to_admit(20) == 0  # eval samples submitted at the round's start
    assert this_round.groups_to_admit(5) == 0
    assert this_round.groups_to_admit(4) == 1
    assert not this_round.over(in_flight=3)
    assert this_round.over(in_flight=0)


def test_a_stop_ends_the_round_and_the_wait_for_weights():
    this_round = ConventionalRound(start_version=0, steps=2, groups_left=5, max_in_flight=8, group_size=4)
    assert this_round.generating(in_flight=8, stop_requested=False)
    assert not this_round.generating(in_flight=8, stop_requested=True)
    assert not wait_over(engine_version=1, wanted_version=2, stop_requested=False)
    assert wait_over(engine_version=1, wanted_version=2, stop_requested=True)


def test_the_wait_for_weights_ends_at_the_version_or_later():
    assert not wait_over(engine_version=7, wanted_version=8, stop_requested=False)
    assert wait_over(engine_version=8, wanted_version=8, stop_requested=False)
    assert wait_over(engine_version=9, wanted_version=8, stop_requested=False)
